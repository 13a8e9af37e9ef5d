"""A small, exact stand-in for numpy's ndarray inside the sandbox.

numpy has no build for WebAssembly (WASI) on PyPI, so a handler built by `tessera build` has no
numpy. `pb_utils.Tensor.as_numpy()` then returns this `ndarray`: row-major, any shape, the
datatypes of KServe v2, and the operations pre/post-processing code uses on tensors
(arithmetic with numpy's broadcasting, type promotion and integer wrap-around, comparisons,
`astype`, `reshape`, indexing on the first axis, reductions over the whole array). The results
equal numpy's: the tests compare every operation with real numpy on the host.

What is not here fails with `NotInSandbox`, naming the call: never a wrong answer.
"""

from __future__ import annotations

import decimal
import itertools
import math
import operator
import struct

# Marks the stand-in, for code that must tell it from real numpy.
__tessera_stand_in__ = True

__all__ = [
    "NotInSandbox", "dtype", "ndarray", "array", "zeros", "ones", "full", "result_type",
    "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "object_", "bytes_", "str_",
]


class NotInSandbox(NotImplementedError):
    """A numpy feature that the sandbox's stand-in does not have."""

    def __init__(self, what: str):
        super().__init__(
            f"{what} is not available in Tessera's Python sandbox (numpy has no WebAssembly "
            "build; tensors are tessera_ndarray arrays: see docs/writing-handlers-python.md "
            "for what they support)")


class MissingAttribute(NotInSandbox, AttributeError):
    """A numpy attribute the stand-in lacks: `hasattr` says False, as for any missing one."""


class dtype:
    """A datatype. Calling it makes a scalar of that type, as `np.float32(1.5)` does."""

    __slots__ = ("name", "kind", "itemsize", "code", "bits")

    def __init__(self, name: str, kind: str, itemsize: int, code: str):
        self.name, self.kind, self.itemsize, self.code = name, kind, itemsize, code
        self.bits = itemsize * 8

    def __repr__(self):
        return f"dtype('{self.name}')"

    def __str__(self):
        return self.name

    def __eq__(self, other):
        try:
            return as_dtype(other) is self
        except (TypeError, NotInSandbox):
            return False

    def __hash__(self):
        return hash(self.name)

    @property
    def type(self):
        return self

    def __call__(self, value=0):
        return _cast_scalar(value, _kind_of_value(value), self)


bool_ = dtype("bool", "b", 1, "?")
int8 = dtype("int8", "i", 1, "b")
int16 = dtype("int16", "i", 2, "h")
int32 = dtype("int32", "i", 4, "i")
int64 = dtype("int64", "i", 8, "q")
uint8 = dtype("uint8", "u", 1, "B")
uint16 = dtype("uint16", "u", 2, "H")
uint32 = dtype("uint32", "u", 4, "I")
uint64 = dtype("uint64", "u", 8, "Q")
float16 = dtype("float16", "f", 2, "e")
float32 = dtype("float32", "f", 4, "f")
float64 = dtype("float64", "f", 8, "d")
object_ = dtype("object", "O", 8, "")


class _TextType:
    """numpy's `bytes_` and `str_` as a dtype argument: `astype(np.bytes_)`,
    `np.array(values, dtype=np.bytes_)`, `np.bytes_(v)` give each value's text as numpy writes
    it (`b"0.1"` for float32 0.1). The array holds them as an object array, the form a BYTES
    tensor has in Triton's Python backend (numpy's would be `|S3`, with the same values)."""

    def __init__(self, name: str, encode: bool):
        self.__name__ = name
        self.encode = encode

    def __repr__(self):
        return f"<class 'numpy.{self.__name__}'>"

    def __call__(self, value=b""):
        # numpy's scalar constructors: `np.bytes_(5)` is `bytes(5)` (five NULs; True one), and
        # `np.str_(b"ab")` is `str(b"ab")`.
        if self.encode and isinstance(value, int):
            return bytes(int(value))
        if not self.encode and isinstance(value, bytes):
            return str(value)
        return _text_of(value, _kind_of_value(value), float64, self.encode)

    def __instancecheck__(self, value):
        return isinstance(value, bytes if self.encode else str)


bytes_ = _TextType("bytes_", True)
str_ = _TextType("str_", False)

_BY_NAME = {d.name: d for d in (bool_, int8, int16, int32, int64, uint8, uint16, uint32,
                                 uint64, float16, float32, float64, object_)}
_BY_NAME.update({"bool_": bool_, "object_": object_, "single": float32,
                 "double": float64, "half": float16})
_PY_TYPES = {bool: bool_, int: int64, float: float64, bytes: object_, str: object_,
             object: object_}


def _text_target(d):
    """`bytes_` or `str_` when `d` asks for numpy's text types (which convert each value to its
    text), else None."""
    if isinstance(d, _TextType):
        return d
    if d is bytes:
        return bytes_
    if d is str:
        return str_
    name = d if isinstance(d, str) else getattr(d, "__name__", None)
    if name in ("bytes_", "bytes", "S", "|S", "string_"):
        return bytes_
    if name in ("str_", "str", "unicode", "U", "<U", "unicode_"):
        return str_
    return None


def as_dtype(d) -> dtype:
    """`d` as a dtype: a dtype, its name, a Python type, or a real numpy dtype or type."""
    if isinstance(d, dtype):
        return d
    if d is None:
        return float64
    if _text_target(d) is not None:
        return object_
    if isinstance(d, type) and d in _PY_TYPES:
        return _PY_TYPES[d]
    name = d if isinstance(d, str) else getattr(d, "name", None) or getattr(d, "__name__", None)
    if isinstance(name, str):
        name = name.rstrip("_") if name not in _BY_NAME else name
        if name in _BY_NAME:
            return _BY_NAME[name]
        if name in ("bytes", "str", "object"):
            return object_
    raise TypeError(f"data type {d!r} not understood")


# --- scalars ----------------------------------------------------------------------------------

def _kind_of_value(v) -> str:
    if isinstance(v, bool):
        return "b"
    if isinstance(v, int):
        return "i"
    if isinstance(v, float):
        return "f"
    return "O"


def _wrap_int(v: int, d: dtype) -> int:
    v &= (1 << d.bits) - 1
    if d.kind == "i" and v >= 1 << (d.bits - 1):
        v -= 1 << d.bits
    return v


def _round_float(v: float, d: dtype) -> float:
    if d is float64 or math.isnan(v) or math.isinf(v):
        return v
    try:
        return struct.unpack(d.code, struct.pack(d.code, v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _round_floats(values: list, d: dtype) -> list:
    """`values` rounded to `d` in one pack/unpack (per value only when one overflows)."""
    if d is float64:
        return values
    try:
        return list(struct.unpack(f"<{len(values)}{d.code}",
                                  struct.pack(f"<{len(values)}{d.code}", *values)))
    except (OverflowError, struct.error):
        return [_round_float(v, d) for v in values]


# numpy writes a float positionally from 1e-4 up to this, in scientific notation past it.
_POSITIONAL_BELOW = {"float16": 1e3, "float32": 1e6, "float64": 1e16}


def _shortest_float_text(v: float, d: "dtype") -> str:
    """numpy's text of a float of dtype `d` (its `str`): the shortest digits that read back as
    the same value in `d` (float32 0.1 is "0.1", not the double's "0.10000000149011612"),
    positional between 1e-4 and a bound of the type, else scientific ("1.6777216e+07")."""
    if math.isnan(v) or math.isinf(v) or v == 0:
        return repr(v)
    shortest = repr(v)
    if d is not float64:
        for digits in range(17):
            # The rounded digits, or one step either side (at a power of two the spacing of
            # the type changes, and the closest digits may read back only from one side).
            mantissa, exponent = f"{v:.{digits}e}".split("e")
            step = 10.0 ** -digits
            found = [text for text in (
                f"{float(mantissa) + delta * step:.{digits}f}e{exponent}" for delta in (0, 1, -1))
                if _round_float(float(text), d) == v]
            if found:
                # The closest (exactly: a tie keeps the rounded digits, as numpy does).
                shortest = min(found, key=lambda text: abs(decimal.Decimal(text)
                                                           - decimal.Decimal(v)))
                shortest = f"{float(shortest):.{digits}e}"
                break
    if v == 0 or 1e-4 <= abs(v) < _POSITIONAL_BELOW[d.name]:
        return repr(float(shortest))
    if "e" not in shortest:
        return shortest
    # The shortest digits, in Python's exponent style (at least two digits, with a sign).
    digits, exponent = shortest.split("e")
    digits = digits.rstrip("0").rstrip(".") if "." in digits else digits
    return f"{digits}e{int(exponent):+03d}"


def _text_of(v, src_kind: str, src: "dtype", encode: bool):
    """One value as numpy's `astype(bytes_)` (encode) or `astype(str_)` writes it."""
    if src_kind == "f" or isinstance(v, float):
        text = _shortest_float_text(v, src if src_kind == "f" else float64)
    elif isinstance(v, bytes):
        # numpy's bytes_ and str_ convert with ASCII (UnicodeDecodeError otherwise), as here.
        return v if encode else v.decode("ascii")
    elif isinstance(v, str):
        text = v
    else:
        text = str(v)  # ints, bools ("True"), and, as numpy, any other object's str
    # numpy's bytes_ takes ASCII only (UnicodeEncodeError otherwise), as here.
    return text.encode("ascii") if encode else text


def _cast_scalar(v, src_kind: str, d: dtype):
    """One value cast to `d`, as numpy's astype does."""
    if d.kind == "O":
        return v
    if src_kind == "O":
        if isinstance(v, (bytes, str)):
            # numpy parses the text (b"1.5".astype(float32)); do the same, strictly.
            text = v.decode() if isinstance(v, bytes) else v
            try:
                v = float(text) if d.kind == "f" else int(text)
            except ValueError:
                raise ValueError(f"could not convert {v!r} to {d.name}") from None
            src_kind = "f" if d.kind == "f" else "i"
        else:
            raise NotInSandbox(f"casting an object array of {type(v).__name__} to {d.name}")
    if d.kind == "b":
        return bool(v)
    if d.kind == "f":
        return _round_float(float(v), d)
    # to an integer
    if src_kind == "f":
        if math.isnan(v) or math.isinf(v):
            raise ValueError(f"cannot convert {v} to {d.name} (numpy's result is undefined)")
        v = int(v)  # truncates toward zero, like C
    return _wrap_int(int(v), d)


# --- type promotion ---------------------------------------------------------------------------

_INT_BY_BITS = {8: int8, 16: int16, 32: int32, 64: int64}
_FLOAT_FOR_INT_BITS = {8: float16, 16: float32, 32: float64, 64: float64}


def _promote(a: dtype, b: dtype) -> dtype:
    """numpy's promote_types for the datatypes here."""
    if a is b:
        return a
    if a.kind == "O" or b.kind == "O":
        return object_
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a.kind == "f" and b.kind == "f":
        return a if a.bits >= b.bits else b
    if a.kind == "f" or b.kind == "f":
        f, i = (a, b) if a.kind == "f" else (b, a)
        need = _FLOAT_FOR_INT_BITS[i.bits]
        return f if f.bits >= need.bits else need
    if a.kind == b.kind:
        return a if a.bits >= b.bits else b
    s, u = (a, b) if a.kind == "i" else (b, a)
    if s.bits > u.bits:
        return s
    return _INT_BY_BITS.get(u.bits * 2, float64)


def _promote_with_scalar(d: dtype, v) -> dtype:
    """numpy 2 (NEP 50): a Python scalar takes the array's type unless its kind is higher."""
    k = _kind_of_value(v)
    if k == "O":
        raise NotInSandbox(f"arithmetic between an array and a {type(v).__name__}")
    if k == "b" or (k == "i" and d.kind in "iuf") or (k == "f" and d.kind == "f"):
        if k == "i" and d.kind in "iu":
            lo, hi = ((-(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1) if d.kind == "i"
                      else (0, (1 << d.bits) - 1))
            if not lo <= v <= hi:
                raise OverflowError(f"Python integer {v} out of bounds for {d.name}")
        return d
    if k == "i":  # with a bool array
        return int64
    return float64  # a float with a bool or integer array


def result_type(*operands) -> dtype:
    out = None
    for o in operands:
        d = o.dtype if isinstance(o, ndarray) else None
        if d is None:
            continue
        out = d if out is None else _promote(out, d)
    for o in operands:
        if not isinstance(o, ndarray):
            out = as_dtype(type(o)) if out is None else _promote_with_scalar(out, o)
    return out


# --- arrays -----------------------------------------------------------------------------------

def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _broadcast_shape(a, b):
    out = []
    for x, y in itertools.zip_longest(reversed(a), reversed(b), fillvalue=1):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"operands could not be broadcast together with shapes "
                             f"{tuple(a)} {tuple(b)}")
        out.append(max(x, y))
    return tuple(reversed(out))


def _broadcast_values(arr: "ndarray", shape) -> list:
    """`arr`'s values laid out in `shape` (numpy's broadcasting), row-major."""
    if arr.shape == shape:
        return arr._data
    if arr.size == 1:
        return arr._data * _size(shape)
    src = (1,) * (len(shape) - len(arr.shape)) + arr.shape
    strides, step = [], 1
    for s in reversed(src):
        strides.append(step if s != 1 else 0)
        step *= s
    strides.reverse()
    data = arr._data
    return [data[sum(i * st for i, st in zip(idx, strides))]
            for idx in itertools.product(*(range(s) for s in shape))]


def _infer_shape(obj):
    if isinstance(obj, ndarray):
        return obj.shape
    if isinstance(obj, (list, tuple)):
        if not obj:
            return (0,)
        inner = _infer_shape(obj[0])
        for o in obj[1:]:
            if _infer_shape(o) != inner:
                raise ValueError("setting an array element with a sequence: the nested lists "
                                 "have different lengths")
        return (len(obj),) + inner
    return ()


def _flatten(obj, out):
    if isinstance(obj, ndarray):
        out.extend(obj._data)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _flatten(o, out)
    else:
        out.append(obj)


def _flatten_as_text(obj, out, text):
    """`_flatten`, each value made text as numpy does, an array's values by their own dtype
    (float32 0.1 in `np.array([a], dtype=np.bytes_)` is b"0.1")."""
    if isinstance(obj, ndarray):
        kind = obj.dtype.kind
        out.extend(_text_of(v, kind, obj.dtype, text.encode) for v in obj._data)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _flatten_as_text(o, out, text)
    else:
        out.append(_text_of(obj, _kind_of_value(obj), float64, text.encode))


def _float_div(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _floor_div(a, b, kind):
    if kind == "f":
        try:
            return float(a // b)
        except ZeroDivisionError:
            return _float_div(a, b) if a != 0 else math.nan
    return 0 if b == 0 else a // b


def _mod(a, b, kind):
    if kind == "f":
        try:
            return math.fmod(a, b) if (a < 0) == (b < 0) else a % b
        except (ZeroDivisionError, ValueError):
            return math.nan
    return 0 if b == 0 else a % b


class ndarray:
    """A row-major array: `shape`, `dtype` and the values as Python scalars."""

    __slots__ = ("_data", "shape", "dtype")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float64, buffer=None):
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        d = as_dtype(dtype)
        if buffer is None:
            data = [None if d.kind == "O" else d(0)] * _size(shape)
        elif isinstance(buffer, (bytes, bytearray, memoryview)):
            need = _size(shape) * d.itemsize
            if len(buffer) < need:
                raise TypeError("buffer is too small for requested array")
            data = ndarray.frombuffer(bytes(buffer[:need]), d, shape)._data
        else:  # numpy reads a buffer's bytes, never a sequence's values
            raise TypeError(f"a bytes-like object is required, not '{type(buffer).__name__}'")
        self.shape, self.dtype, self._data = shape, d, data

    # --- construction from and to the wire --------------------------------------------------
    @classmethod
    def _of(cls, data: list, shape, d: dtype) -> "ndarray":
        a = cls.__new__(cls)
        a._data, a.shape, a.dtype = data, tuple(shape), d
        return a

    @classmethod
    def frombuffer(cls, raw: bytes, d, shape) -> "ndarray":
        d = as_dtype(d)
        n = _size(shape)
        if d.kind == "O":
            raise TypeError("object arrays are not read from a buffer")
        if len(raw) != n * d.itemsize:
            raise ValueError(f"{len(raw)} bytes do not hold {n} elements of {d.name}")
        return cls._of(list(struct.unpack(f"<{n}{d.code}", raw)), shape, d)

    def tobytes(self) -> bytes:
        if self.dtype.kind == "O":
            raise NotInSandbox("tobytes() of an object array")
        return struct.pack(f"<{len(self._data)}{self.dtype.code}", *self._data)

    def tolist(self):
        def build(offset, dims):
            if not dims:
                return self._data[offset]
            step = _size(dims[1:])
            return [build(offset + i * step, dims[1:]) for i in range(dims[0])]
        return build(0, self.shape) if self.shape else self._data[0]

    # --- properties -------------------------------------------------------------------------
    @property
    def size(self):
        return len(self._data)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.itemsize * self.size

    @property
    def flat(self):
        return iter(self._data)

    @property
    def T(self):
        return self.transpose()

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self):
        return f"array({self.tolist()!r}, dtype={self.dtype.name})"

    def __bool__(self):
        if self.size != 1:
            raise ValueError("The truth value of an array with more than one element is "
                             "ambiguous. Use a.any() or a.all()")
        return bool(self._data[0])

    def __getattr__(self, name):
        raise MissingAttribute(f"ndarray.{name}")

    # --- shape ------------------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) > 1:
            raise ValueError("can only specify one unknown dimension")
        if -1 in shape:
            known = _size(s for s in shape if s != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"cannot reshape array of size {self.size} into shape "
                                 f"{tuple(shape)}")
            shape[shape.index(-1)] = self.size // known
        if _size(shape) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} into shape {tuple(shape)}")
        return ndarray._of(self._data, shape, self.dtype)

    def flatten(self):
        return ndarray._of(list(self._data), (self.size,), self.dtype)

    ravel = flatten

    def squeeze(self):
        return ndarray._of(self._data, tuple(s for s in self.shape if s != 1), self.dtype)

    def transpose(self):
        if self.ndim < 2:
            return self
        if self.ndim > 2:
            raise NotInSandbox("transpose() of more than two dimensions")
        rows, cols = self.shape
        return ndarray._of([self._data[r * cols + c] for c in range(cols) for r in range(rows)],
                           (cols, rows), self.dtype)

    def copy(self):
        return ndarray._of(list(self._data), self.shape, self.dtype)

    def astype(self, d, copy=True):
        text = _text_target(d)
        if text is not None:
            kind = self.dtype.kind
            return ndarray._of([_text_of(v, kind, self.dtype, text.encode) for v in self._data],
                               self.shape, object_)
        d = as_dtype(d)
        if d is self.dtype:
            return self.copy() if copy else self
        kind = self.dtype.kind
        if d.kind == "f" and kind in "fiub":
            return ndarray._of(_round_floats([float(v) for v in self._data], d), self.shape, d)
        return ndarray._of([_cast_scalar(v, kind if kind != "u" else "i", d) for v in self._data],
                           self.shape, d)

    # --- indexing ---------------------------------------------------------------------------
    def __getitem__(self, index):
        if isinstance(index, tuple):
            if len(index) > self.ndim:
                raise IndexError("too many indices for array")
            # Integers index one axis after the other; a full slice after them keeps the rest.
            out = self
            for depth, i in enumerate(index):
                if isinstance(i, slice) and i == slice(None):
                    if all(isinstance(j, slice) and j == slice(None) for j in index[depth:]):
                        return out
                    raise NotInSandbox("a full slice before another index")
                if isinstance(i, slice) and depth:
                    raise NotInSandbox("slicing an axis after the first")
                if isinstance(i, slice) and len(index) > 1:
                    raise NotInSandbox("a slice followed by another index")
                out = out[i]
            return out
        if not self.shape:
            raise IndexError("invalid index to scalar variable.")
        step = _size(self.shape[1:])
        if isinstance(index, slice):
            rows = range(*index.indices(self.shape[0]))
            data = [v for r in rows for v in self._data[r * step:(r + 1) * step]]
            return ndarray._of(data, (len(rows),) + self.shape[1:], self.dtype)
        if isinstance(index, bool) or not isinstance(index, int):
            raise NotInSandbox(f"indexing with {type(index).__name__}")
        n = self.shape[0]
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of bounds for axis 0 with size {n}")
        index %= n
        if self.ndim == 1:
            return self._data[index]
        return ndarray._of(self._data[index * step:(index + 1) * step], self.shape[1:], self.dtype)

    def __setitem__(self, index, value):
        raise NotInSandbox("assigning into an array (build a new one instead)")

    # --- arithmetic -------------------------------------------------------------------------
    def _binary(self, other, op, reflected=False, compare=False):
        if isinstance(other, (list, tuple)):
            other = array(other)
        if compare and isinstance(other, (bool, int, float)):
            # An integer array compares with the scalar's exact value, in range of the dtype or
            # not; a float array with the scalar cast to its dtype first (numpy 2's rule for
            # Python scalars, NEP 50): float32 `0.7 >= 0.7` holds.
            if self.dtype.kind == "f" and self.dtype is not float64:
                other = _round_floats([float(other)], self.dtype)[0]
            values = op(self._data, [other] * self.size, None)
            return ndarray._of(values, self.shape, bool_)
        if compare and self.dtype.kind == "O" and isinstance(other, (bytes, str, type(None))):
            # Elementwise, as numpy compares an object array with a scalar.
            values = op(self._data, [other] * self.size, None)
            return ndarray._of(values, self.shape, bool_)
        if isinstance(other, ndarray):
            d = _promote(self.dtype, other.dtype)
            shape = _broadcast_shape(self.shape, other.shape)
            left, right = _broadcast_values(self, shape), _broadcast_values(other, shape)
        elif isinstance(other, (bool, int, float)):
            d = _promote_with_scalar(self.dtype, other)
            shape = self.shape
            left, right = self._data, [other] * self.size
        else:
            return NotImplemented
        if reflected:
            left, right = right, left
        if d.kind == "O":
            raise NotInSandbox("arithmetic on object arrays")
        values = op(left, right, d)
        if compare:
            return ndarray._of(values, shape, bool_)
        return values if isinstance(values, ndarray) else ndarray._of(values, shape, d)

    @staticmethod
    def _arith(fn, *, true_div=False, bools_become=None):
        def op(left, right, d):
            if d.kind == "b" and bools_become is not None:
                # numpy computes // and % of two bool arrays in int8.
                d = bools_become
                return _Result([_wrap_int(fn(int(a), int(b), "i"), d)
                                for a, b in zip(left, right)], d)
            if true_div:
                out = d if d.kind == "f" else float64
                return _Result(_round_floats([_float_div(float(a), float(b))
                                              for a, b in zip(left, right)], out), out)
            if d.kind == "f":
                return _round_floats([fn(float(a), float(b), "f") for a, b in zip(left, right)], d)
            if d.kind == "b":
                return [bool(fn(int(a), int(b), "i")) for a, b in zip(left, right)]
            return [_wrap_int(fn(int(a), int(b), "i"), d) for a, b in zip(left, right)]
        return op

    def _float_op(self, o, fn):
        """`fn` elementwise when `o` is an array of this float datatype and shape (the common
        case: no promotion or broadcasting), else None. Python computes in float64 and the
        result is rounded once to the datatype: exact for +, - and * of float32 or float16
        (float64 has more than twice their precision bits), as numpy's own float32 math."""
        if type(o) is not ndarray or o.dtype is not self.dtype or o.shape != self.shape:
            return None
        if self.dtype.kind != "f":
            return None
        return ndarray._of(_round_floats(list(map(fn, self._data, o._data)), self.dtype),
                           self.shape, self.dtype)

    def __add__(self, o):
        fast = self._float_op(o, operator.add)
        if fast is not None:
            return fast
        return self._finish(self._binary(o, _ADD))

    __radd__ = __add__

    def __sub__(self, o):
        if self.dtype is bool_ and (getattr(o, "dtype", None) is bool_ or isinstance(o, bool)):
            raise TypeError("numpy boolean subtract, the `-` operator, is not supported")
        fast = self._float_op(o, operator.sub)
        if fast is not None:
            return fast
        return self._finish(self._binary(o, _SUB))

    def __rsub__(self, o):
        if self.dtype is bool_ and isinstance(o, bool):
            raise TypeError("numpy boolean subtract, the `-` operator, is not supported")
        return self._finish(self._binary(o, _SUB, True))

    def __mul__(self, o):
        fast = self._float_op(o, operator.mul)
        if fast is not None:
            return fast
        return self._finish(self._binary(o, _MUL))

    __rmul__ = __mul__

    def _true_div_operand(self, o):
        # True division of integers runs in float64: a Python int is a float64 operand then,
        # never out of the integer dtype's bounds.
        if isinstance(o, int) and not isinstance(o, bool) and self.dtype.kind in "biu":
            return float(o)
        return o

    def __truediv__(self, o):
        o = self._true_div_operand(o)
        return self._finish(self._binary(o, ndarray._arith(None, true_div=True)))

    def __rtruediv__(self, o):
        o = self._true_div_operand(o)
        return self._finish(self._binary(o, ndarray._arith(None, true_div=True), True))

    def __floordiv__(self, o):
        return self._finish(self._binary(o, ndarray._arith(_floor_div, bools_become=int8)))

    def __rfloordiv__(self, o):
        return self._finish(self._binary(o, ndarray._arith(_floor_div, bools_become=int8), True))

    def __mod__(self, o):
        return self._finish(self._binary(o, ndarray._arith(_mod, bools_become=int8)))

    def __rmod__(self, o):
        return self._finish(self._binary(o, ndarray._arith(_mod, bools_become=int8), True))

    @staticmethod
    def _finish(result):
        if isinstance(result, ndarray) and isinstance(result._data, _Result):
            result.dtype = result._data.dtype
            result._data = list(result._data)
        return result

    def _compare(self, o, fn):
        return self._binary(o, lambda left, right, d: [fn(a, b) for a, b in zip(left, right)],
                            compare=True)

    def __eq__(self, o):
        return self._compare(o, lambda a, b: a == b)

    def __ne__(self, o):
        return self._compare(o, lambda a, b: a != b)

    def __lt__(self, o):
        return self._compare(o, lambda a, b: a < b)

    def __le__(self, o):
        return self._compare(o, lambda a, b: a <= b)

    def __gt__(self, o):
        return self._compare(o, lambda a, b: a > b)

    def __ge__(self, o):
        return self._compare(o, lambda a, b: a >= b)

    __hash__ = None

    def __neg__(self):
        if self.dtype.kind == "b":
            raise TypeError("The numpy boolean negative, the `-` operator, is not supported")
        if self.dtype.kind == "f":
            return ndarray._of([-v for v in self._data], self.shape, self.dtype)
        return ndarray._of([_wrap_int(-v, self.dtype) for v in self._data], self.shape, self.dtype)

    def __pos__(self):
        return self.copy()

    def __abs__(self):
        if self.dtype.kind == "f":
            return ndarray._of([abs(v) for v in self._data], self.shape, self.dtype)
        return ndarray._of([_wrap_int(abs(v), self.dtype) for v in self._data], self.shape,
                           self.dtype)

    # --- reductions -------------------------------------------------------------------------
    def _groups(self, axis):
        """The values along `axis`, one list per position of the other axes (row-major), and
        the shape those positions make."""
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise NotInSandbox(f"axis={axis!r} (one integer axis or None)")
        if not -self.ndim <= axis < self.ndim:
            raise ValueError(f"axis {axis} is out of bounds for array of dimension {self.ndim}")
        axis %= self.ndim
        outer, n, inner = _size(self.shape[:axis]), self.shape[axis], _size(self.shape[axis + 1:])
        data = self._data
        groups = [[data[o * n * inner + k * inner + i] for k in range(n)]
                  for o in range(outer) for i in range(inner)]
        return groups, self.shape[:axis] + self.shape[axis + 1:], axis

    def _reduce(self, axis, keepdims, what, fn, out_dtype, empty_ok=False):
        if self.dtype.kind == "O":
            raise NotInSandbox(f"{what}() of an object array")
        if axis is None:
            if not self._data and not empty_ok:
                raise ValueError(f"zero-size array to reduction operation {what} which has no "
                                 "identity")
            value = fn(self._data)
            if keepdims:
                return ndarray._of([value], (1,) * self.ndim, out_dtype)
            return value
        groups, shape, axis = self._groups(axis)
        if self.shape[axis] == 0 and not empty_ok:
            raise ValueError(f"zero-size array to reduction operation {what} which has no identity")
        if keepdims:
            shape = shape[:axis] + (1,) + shape[axis:]
        return ndarray._of([fn(g) for g in groups], shape, out_dtype)

    def _sum_dtype(self):
        # numpy accumulates small integers in the platform's 64-bit types.
        d = self.dtype
        return d if d.kind == "f" else uint64 if d.kind == "u" else int64

    def sum(self, axis=None, keepdims=False):
        out = self._sum_dtype()
        if out.kind == "f":
            # numpy sums floats pairwise in blocks; this adds exactly and rounds once, which
            # can differ from numpy in the last bit of a float32 sum.
            fn = lambda g: _round_float(math.fsum(g), out)  # noqa: E731
        else:
            fn = lambda g: _wrap_int(sum(int(v) for v in g), out)  # noqa: E731
        return self._reduce(axis, keepdims, "sum", fn, out, empty_ok=True)

    def max(self, axis=None, keepdims=False):
        return self._reduce(axis, keepdims, "max", _nan_or(max), self.dtype)

    def min(self, axis=None, keepdims=False):
        return self._reduce(axis, keepdims, "min", _nan_or(min), self.dtype)

    def argmax(self, axis=None, keepdims=False):
        return self._reduce(axis, keepdims, "argmax", _arg(max, lambda i: -i), int64)

    def argmin(self, axis=None, keepdims=False):
        return self._reduce(axis, keepdims, "argmin", _arg(min, lambda i: i), int64)

    def mean(self, axis=None, keepdims=False):
        out = self.dtype if self.dtype.kind == "f" else float64
        return self._reduce(axis, keepdims, "mean",
                            lambda g: _round_float(math.fsum(g) / len(g), out) if g else math.nan,
                            out, empty_ok=True)

    def any(self, axis=None, keepdims=False):
        return self._reduce(axis, keepdims, "any", lambda g: any(g), bool_, empty_ok=True)

    def all(self, axis=None, keepdims=False):
        return self._reduce(axis, keepdims, "all", lambda g: all(g), bool_, empty_ok=True)

    def argsort(self, axis=-1):
        """Ascending, stable (numpy's default quicksort may order equal values differently);
        NaN last, as numpy."""
        if self.dtype.kind == "O":
            raise NotInSandbox("argsort() of an object array")
        if axis is None:
            return self.flatten().argsort()
        groups, shape, axis = self._groups(axis)
        if axis != self.ndim - 1:
            raise NotInSandbox("argsort along an axis but the last")
        key = lambda g: (lambda i: (g[i] != g[i], g[i] if g[i] == g[i] else 0))  # noqa: E731
        data = [i for g in groups for i in sorted(range(len(g)), key=key(g))]
        return ndarray._of(data, self.shape, int64)


# The elementwise operations, made once (not at every call).
_ADD = ndarray._arith(lambda a, b, k: a + b)
_SUB = ndarray._arith(lambda a, b, k: a - b)
_MUL = ndarray._arith(lambda a, b, k: a * b)


def _nan_or(fn):
    return lambda g: math.nan if any(v != v for v in g) else fn(g)


def _arg(fn, tie):
    """argmax/argmin: the first NaN if any (numpy's rule), else the first extreme."""
    def pick(g):
        for i, v in enumerate(g):
            if v != v:
                return i
        return fn(range(len(g)), key=lambda i: (g[i], tie(i)))
    return pick


class _Result(list):
    """Values of a true division, with the datatype it produced (not the operands')."""

    def __init__(self, values, d):
        super().__init__(values)
        self.dtype = d


def _from_python(v, d: dtype):
    """A Python value as an element of `d`. A Python int out of an integer dtype's range is an
    OverflowError, as in numpy 2 (an array's astype wraps; a literal does not)."""
    if d.kind in "iu" and type(v) is int:
        low, high = (0, (1 << d.bits) - 1) if d.kind == "u" else \
            (-(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1)
        if not low <= v <= high:
            raise OverflowError(f"Python integer {v} out of bounds for {d.name}")
    return _cast_scalar(v, _kind_of_value(v), d)


def array(obj, dtype=None) -> ndarray:
    """An array from nested lists, scalars or another array, as `np.array` makes it."""
    if isinstance(obj, ndarray):
        return obj.astype(dtype) if dtype is not None else obj.copy()
    shape = _infer_shape(obj)
    flat: list = []
    text = _text_target(dtype) if dtype is not None else None
    if text is not None:
        _flatten_as_text(obj, flat, text)
        return ndarray._of(flat, shape, object_)
    _flatten(obj, flat)
    if dtype is None:
        kinds = {_kind_of_value(v) for v in flat}
        d = (object_ if "O" in kinds else float64 if "f" in kinds else int64 if "i" in kinds
             else bool_ if kinds else float64)
        if d is int64 and any(type(v) is int and not -(1 << 63) <= v < 1 << 63 for v in flat):
            # As numpy: each int is int64, else uint64, else a Python int; uint64s alone stay
            # uint64, with int64s they make float64.
            kinds = {"i" if -(1 << 63) <= v < 1 << 63 else "u" if 0 <= v < 1 << 64 else "O"
                     for v in flat if type(v) is int}
            d = object_ if "O" in kinds else uint64 if kinds == {"u"} else float64
        if d is object_:
            return ndarray._of(flat, shape, object_)
    else:
        d = as_dtype(dtype)
    return ndarray._of([_from_python(v, d) for v in flat], shape, d)


def full(shape, value, dtype=None) -> ndarray:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    text = _text_target(dtype) if dtype is not None else None
    if text is not None:
        # numpy makes the array of one character (`S1`/`U1`) and cuts the value to fit it.
        value = _text_of(value, _kind_of_value(value), float64, text.encode)[:1]
        return ndarray._of([value] * _size(shape), shape, object_)
    d = as_dtype(dtype) if dtype is not None else as_dtype(type(value))
    return ndarray._of([_from_python(value, d)] * _size(shape), shape, d)


def zeros(shape, dtype=float64) -> ndarray:
    text = _text_target(dtype)
    if text is not None:  # numpy's empty strings
        return full(shape, b"" if text.encode else "", dtype)
    return full(shape, 0, dtype)


def ones(shape, dtype=float64) -> ndarray:
    return full(shape, 1, dtype)
