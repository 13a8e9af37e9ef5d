"""`numpy` inside Tessera's Python sandbox: the subset `tessera_ndarray` implements.

numpy has no WebAssembly build, so `tessera build` puts this package on the component's path:
a model.py's `import numpy as np` gets numpy's names for what the stand-in computes exactly as
numpy does (compared with real numpy in tests/python/test_pb_utils_shim.py), and a named
`NotInSandbox` error for the rest. docs/writing-handlers-python.md lists it call by call.
"""

import builtins as _builtins
import math as _math

import tessera_ndarray as _t
from tessera_ndarray import (  # noqa: F401 - numpy's names
    NotInSandbox, __tessera_stand_in__, array, bool_, bytes_, dtype, float16, float32, float64,
    full, int8, int16, int32, int64, ndarray, object_, ones, result_type, str_, uint8, uint16,
    uint32, uint64, zeros,
)

__version__ = "0+tessera.sandbox"
single, double, half = float32, float64, float16
nan, inf, pi, e = _math.nan, _math.inf, _math.pi, _math.e


def asarray(a, dtype=None):
    # (A text dtype converts, although its arrays are object arrays: no shortcut for it.)
    if isinstance(a, ndarray) and (dtype is None or (_t._text_target(dtype) is None
                                                     and _t.as_dtype(dtype) is a.dtype)):
        return a
    return array(a, dtype)


def frombuffer(buffer, dtype=float64):
    d = _t.as_dtype(dtype)
    return ndarray.frombuffer(bytes(buffer), d, (len(buffer) // d.itemsize,))


def zeros_like(a, dtype=None):
    return zeros(a.shape, dtype or a.dtype)


def ones_like(a, dtype=None):
    return ones(a.shape, dtype or a.dtype)


def full_like(a, value, dtype=None):
    return full(a.shape, value, dtype or a.dtype)


def arange(start, stop=None, step=1, dtype=None):
    if stop is None:
        start, stop = 0, start
    values = []
    v = start
    while (step > 0 and v < stop) or (step < 0 and v > stop):
        values.append(v)
        v = start + len(values) * step
    if dtype is None:
        dtype = float64 if _builtins.any(isinstance(x, float) for x in (start, stop, step)) else int64
    return array(values, dtype)


def reshape(a, shape):
    return asarray(a).reshape(shape)


def squeeze(a):
    return asarray(a).squeeze()


def transpose(a):
    return asarray(a).transpose()


def concatenate(arrays, axis=0):
    arrays = [asarray(a) for a in arrays]
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    first = arrays[0]
    if not -first.ndim <= axis < first.ndim:
        raise ValueError(f"axis {axis} is out of bounds for array of dimension {first.ndim}")
    axis %= first.ndim
    for a in arrays[1:]:
        if a.ndim != first.ndim or a.shape[:axis] != first.shape[:axis] \
                or a.shape[axis + 1:] != first.shape[axis + 1:]:
            raise ValueError("all the input array dimensions except for the concatenation axis "
                             "must match exactly")
    d = arrays[0].dtype
    for a in arrays[1:]:
        d = _t._promote(d, a.dtype)
    arrays = [a.astype(d, copy=False) for a in arrays]
    outer = _t._size(first.shape[:axis])
    inner = _t._size(first.shape[axis + 1:])
    data = []
    for o in range(outer):
        for a in arrays:
            chunk = a.shape[axis] * inner
            data.extend(a._data[o * chunk:(o + 1) * chunk])
    shape = (first.shape[:axis] + (_builtins.sum(a.shape[axis] for a in arrays),)
             + first.shape[axis + 1:])
    return ndarray._of(data, shape, d)


def stack(arrays, axis=0):
    arrays = [asarray(a) for a in arrays]
    if not arrays:
        raise ValueError("need at least one array to stack")
    if _builtins.any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError("all input arrays must have the same shape")
    ndim = arrays[0].ndim + 1
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of bounds for array of dimension {ndim}")
    axis %= ndim
    shape = arrays[0].shape[:axis] + (1,) + arrays[0].shape[axis:]
    return concatenate([a.reshape(shape) for a in arrays], axis=axis)


def _reduction(name):
    def reduce(a, axis=None, keepdims=False):
        return getattr(asarray(a), name)(axis=axis, keepdims=keepdims)
    reduce.__name__ = name
    return reduce


sum = _reduction("sum")  # noqa: A001 - numpy's name
max = amax = _reduction("max")  # noqa: A001
min = amin = _reduction("min")  # noqa: A001
mean = _reduction("mean")
any = _reduction("any")  # noqa: A001
all = _reduction("all")  # noqa: A001


def argmax(a, axis=None, keepdims=False):
    return asarray(a).argmax(axis=axis, keepdims=keepdims)


def argmin(a, axis=None, keepdims=False):
    return asarray(a).argmin(axis=axis, keepdims=keepdims)


def argsort(a, axis=-1):
    return asarray(a).argsort(axis=axis)


def _unary(name, fn):
    """An elementwise function computed in double precision and rounded to the result's
    type: for float32 inputs it can differ from numpy's own float32 kernels by one unit in the
    last place."""
    def apply(x):
        a = asarray(x)
        if a.dtype.kind == "O":
            raise NotInSandbox(f"numpy.{name} of an object array")
        out = a.dtype if a.dtype.kind == "f" else float64
        values = []
        for v in a._data:
            try:
                values.append(fn(float(v)))
            except (ValueError, OverflowError):
                values.append(_domain(name, float(v)))
        result = ndarray._of(_t._round_floats(values, out), a.shape, out)
        return result if isinstance(x, ndarray) or a.ndim else result._data[0]
    apply.__name__ = name
    return apply


def _domain(name, v):
    if name == "exp":
        return _math.inf
    if name in ("log", "log2", "log10"):
        return -_math.inf if v == 0 else _math.nan
    return _math.nan


exp = _unary("exp", _math.exp)
log = _unary("log", _math.log)
log2 = _unary("log2", _math.log2)
log10 = _unary("log10", _math.log10)
sqrt = _unary("sqrt", _math.sqrt)
tanh = _unary("tanh", _math.tanh)
sin = _unary("sin", _math.sin)
cos = _unary("cos", _math.cos)
_floor = _unary("floor", lambda v: float(_math.floor(v)) if _math.isfinite(v) else v)
_ceil = _unary("ceil", lambda v: float(_math.ceil(v)) if _math.isfinite(v) else v)


def _integral_kept(name, on_floats):
    """numpy 2 keeps integer arrays as they are for floor and ceil."""
    def apply(x):
        a = asarray(x)
        if a.dtype.kind in "iu":
            return a.copy()
        if a.dtype.kind == "b":
            raise NotInSandbox(f"numpy.{name} of a bool array")
        return on_floats(x)
    apply.__name__ = name
    return apply


floor = _integral_kept("floor", _floor)
ceil = _integral_kept("ceil", _ceil)


def abs(x):  # noqa: A001 - numpy's name
    return _builtins.abs(asarray(x))


absolute = abs


def _arrays(*values):
    """The operands as arrays; a Python scalar beside an array takes the type numpy gives it
    there (NEP 50: `np.where(c, float32_array, 0)` stays float32)."""
    arrays = [v for v in values if isinstance(v, ndarray)]
    out = []
    for v in values:
        if isinstance(v, ndarray):
            out.append(v)
        elif isinstance(v, (bool, int, float)) and arrays:
            d = arrays[0].dtype
            for a in arrays[1:]:
                d = _t._promote(d, a.dtype)
            out.append(asarray(v, _t._promote_with_scalar(d, v)))
        else:
            out.append(asarray(v))
    return out


def _pairwise(name, pick):
    def apply(a, b):
        a, b = _arrays(a, b)
        d = _t._promote(a.dtype, b.dtype)
        shape = _t._broadcast_shape(a.shape, b.shape)
        left = _t._broadcast_values(a.astype(d, copy=False), shape)
        right = _t._broadcast_values(b.astype(d, copy=False), shape)
        return ndarray._of([pick(x, y) for x, y in zip(left, right)], shape, d)
    apply.__name__ = name
    return apply


# numpy propagates NaN through maximum/minimum.
maximum = _pairwise("maximum", lambda x, y: x if x != x else y if y != y else (x if x >= y else y))
minimum = _pairwise("minimum", lambda x, y: x if x != x else y if y != y else (x if x <= y else y))


def where(condition, x, y):
    c = asarray(condition)
    x, y = _arrays(x, y)
    d = _t._promote(x.dtype, y.dtype)
    shape = _t._broadcast_shape(_t._broadcast_shape(c.shape, x.shape), y.shape)
    cs = _t._broadcast_values(c, shape)
    xs = _t._broadcast_values(x.astype(d, copy=False), shape)
    ys = _t._broadcast_values(y.astype(d, copy=False), shape)
    return ndarray._of([xv if cv else yv for cv, xv, yv in zip(cs, xs, ys)], shape, d)


def _operand(bound, a):
    """A bound as an array of the type numpy would give it beside `a` (NEP 50)."""
    if isinstance(bound, ndarray):
        return bound
    return asarray(bound, _t.result_type(a, bound))


def clip(a, a_min, a_max):
    a = asarray(a)
    out = a
    if a_min is not None:
        out = maximum(out, _operand(a_min, a))
    if a_max is not None:
        out = minimum(out, _operand(a_max, a))
    return out


def allclose(a, b, rtol=1e-05, atol=1e-08):
    a, b = asarray(a), asarray(b)
    shape = _t._broadcast_shape(a.shape, b.shape)
    pairs = zip(_t._broadcast_values(a, shape), _t._broadcast_values(b, shape))
    return _builtins.all(_builtins.abs(float(x) - float(y)) <= atol + rtol * _builtins.abs(float(y))
                         for x, y in pairs)


def array_equal(a, b):
    a, b = asarray(a), asarray(b)
    return a.shape == b.shape and a.tolist() == b.tolist()


def __getattr__(name):
    raise _t.MissingAttribute(f"numpy.{name}")
