"""The Python guest SDK (guest-sdk-python/src) against real numpy, on the host, without Wasm.

In the sandbox, `as_numpy()` returns `tessera_ndarray` arrays (numpy has no WebAssembly build);
every operation they offer is compared here with numpy's result, value and datatype, so a
model.py computes the same in Tessera as in Triton. What they do not offer must fail with
`NotInSandbox`, never answer wrongly. `triton_python_backend_utils` is checked with real numpy
(as the host runs it) for every datatype's round trip through the wire form the host sends.
"""

from __future__ import annotations

import itertools
import math
import re
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "guest-sdk-python" / "src"))

import tessera_ndarray as tnp  # noqa: E402
import tessera_wire as wire  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

NUMERIC = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64"]


def values_for(name: str, n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    if name == "bool_":
        return [bool(v) for v in rng.integers(0, 2, n)]
    d = np.dtype(name)
    if d.kind == "f":
        return [float(np.asarray(v, dtype=name)) for v in rng.normal(0, 50, n)]
    info = np.iinfo(d)
    # Extremes included: arithmetic must wrap as numpy's does.
    picks = [int(info.min), int(info.max), 0, 1]
    return (picks + [int(v) for v in rng.integers(max(info.min, -1000), min(info.max, 1000), n)])[:n]


def both(name: str, shape, seed: int):
    n = math.prod(shape)
    vals = values_for(name, n, seed)
    real = np.array(vals, dtype=name).reshape(shape)
    ours = tnp.array(vals, dtype=name).reshape(shape)
    return real, ours


def same(real, ours, what: str):
    """`ours` equals numpy's `real`: datatype and every value (NaN where NaN)."""
    if isinstance(real, np.ndarray):
        assert isinstance(ours, tnp.ndarray), f"{what}: {type(ours)}"
        assert tuple(ours.shape) == real.shape, f"{what}: shape {ours.shape} vs {real.shape}"
        assert ours.dtype.name == real.dtype.name, f"{what}: dtype {ours.dtype} vs {real.dtype}"
        assert ours.tobytes() == real.tobytes() or _nan_equal(real, ours), f"{what}: values"
    else:
        if isinstance(real, (float, np.floating)) and math.isnan(real):
            assert math.isnan(ours), what
        else:
            assert ours == real, f"{what}: {ours!r} vs {real!r}"


def _nan_equal(real, ours):
    return np.array_equal(real, np.array(ours.tolist(), dtype=real.dtype), equal_nan=True)


OPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": lambda a, b: a % b,
    "==": lambda a, b: a == b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
}


def run(op, a, b):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return op(a, b), None
        except Exception as e:  # noqa: BLE001 - both sides must fail alike
            return None, type(e)


@pytest.mark.parametrize("left,right", list(itertools.product(NUMERIC, NUMERIC)))
def test_arithmetic_promotes_wraps_and_rounds_as_numpy(left, right):
    ra, oa = both(left, (2, 3), 1)
    rb, ob = both(right, (2, 3), 2)
    for symbol, op in OPS.items():
        expected, real_error = run(op, ra, rb)
        if real_error is not None:
            with pytest.raises(Exception):
                op(oa, ob)
            continue
        same(expected, op(oa, ob), f"{left} {symbol} {right}")


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_same_type_float_arithmetic_at_the_edges(name):
    """Arrays of one float type and shape take a shorter path: overflow to infinity, NaN,
    signed zeros and subnormals come out as numpy's."""
    info = np.finfo(name)
    edges = [float(info.max), -float(info.max), float(info.tiny), float(info.smallest_subnormal),
             math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0, 1.0 + float(info.eps)]
    left = [a for a in edges for _ in edges]
    right = edges * len(edges)
    real_a, real_b = np.array(left, dtype=name), np.array(right, dtype=name)
    ours_a, ours_b = tnp.array(left, dtype=name), tnp.array(right, dtype=name)
    for symbol in ("+", "-", "*"):
        expected, error = run(OPS[symbol], real_a, real_b)
        assert error is None
        got = OPS[symbol](ours_a, ours_b)
        same(expected, got, f"{name} {symbol}")
        # Signed zeros too (tobytes tells -0.0 from 0.0).
        assert got.tobytes() == expected.tobytes() or _nan_equal(expected, got), symbol


def test_the_array_constructor_reads_a_buffer_as_numpy():
    raw = struct.pack("<3f", 1.5, -2.0, 3.25)
    same(np.ndarray((3,), dtype=np.float32, buffer=raw),
         tnp.ndarray((3,), dtype=tnp.float32, buffer=raw), "ndarray(buffer=bytes)")
    same(np.ndarray((2, 2), dtype=np.int8, buffer=bytearray(b"\x01\xff\x02\x80")),
         tnp.ndarray((2, 2), dtype=tnp.int8, buffer=bytearray(b"\x01\xff\x02\x80")),
         "ndarray(buffer=bytearray)")
    assert tnp.ndarray(4, dtype=tnp.int32).shape == (4,)
    with pytest.raises(TypeError):
        np.ndarray((2,), dtype=np.float32, buffer=[1.0, 2.0])
    with pytest.raises(TypeError):
        tnp.ndarray((2,), dtype=tnp.float32, buffer=[1.0, 2.0])
    for module in (np, tnp):  # too small: refused; longer: its first bytes are read
        with pytest.raises(TypeError):
            module.ndarray((3,), dtype=module.float32, buffer=b"\x00" * 8)
    same(np.ndarray((1,), dtype=np.int16, buffer=b"\x01\x02\x03"),
         tnp.ndarray((1,), dtype=tnp.int16, buffer=b"\x01\x02\x03"), "a longer buffer")


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("scalar", [3, -2, 2.5, True])
def test_python_scalars_follow_nep_50(name, scalar):
    ra, oa = both(name, (5,), 3)
    for symbol, op in OPS.items():
        for reflected in (False, True):
            f = (lambda x, s=scalar, o=op: o(s, x)) if reflected else (lambda x, s=scalar, o=op: o(x, s))
            expected, real_error = run(lambda x, _: f(x), ra, None)
            if real_error is not None:
                with pytest.raises(Exception):
                    f(oa)
                continue
            same(expected, f(oa), f"{name} {symbol} {scalar!r} reflected={reflected}")


@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((2, 3), (3,)), ((4,), (1,)),
                                    ((2, 1, 3), (4, 1)), ((1,), (2, 2))])
def test_broadcasting(shapes):
    ra, oa = both("float32", shapes[0], 4)
    rb, ob = both("int16", shapes[1], 5)
    same(ra + rb, oa + ob, f"{shapes}")
    same(ra * rb, oa * ob, f"{shapes}")
    with pytest.raises(ValueError):
        tnp.zeros((2, 3)) + tnp.zeros((4,))


@pytest.mark.parametrize("src,dst", list(itertools.product(NUMERIC, NUMERIC)))
def test_astype(src, dst):
    real, ours = both(src, (7,), 6)
    if np.dtype(src).kind == "f" and np.dtype(dst).kind in "iu":
        # numpy's float -> int cast is undefined out of range: compare in range only.
        real = np.clip(real, -100, 100).astype(src)
        ours = tnp.array(real.tolist(), dtype=src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same(real.astype(dst), ours.astype(dst), f"{src} -> {dst}")


def test_float_to_int_of_nan_is_refused_not_invented():
    with pytest.raises(ValueError):
        tnp.array([float("nan")], dtype="float32").astype("int32")


def test_shapes_indexing_and_reductions():
    real, ours = both("int32", (4, 3), 7)
    same(real.reshape(3, -1), ours.reshape(3, -1), "reshape")
    same(real.reshape((2, 6)), ours.reshape((2, 6)), "reshape tuple")
    same(real.flatten(), ours.flatten(), "flatten")
    same(real.T, ours.T, "transpose")
    same(real[1], ours[1], "row")
    same(real[-1], ours[-1], "negative row")
    same(real[1:3], ours[1:3], "slice")
    same(real[::2], ours[::2], "step slice")
    same(real[2, 1], ours[2, 1], "element")
    same(real[1][2], ours[1][2], "element by rows")
    assert ours.tolist() == real.tolist()
    assert (ours.size, ours.ndim, ours.itemsize, ours.nbytes, len(ours)) == \
        (real.size, real.ndim, real.itemsize, real.nbytes, len(real))
    for name in ("sum", "max", "min", "argmax", "argmin", "any", "all"):
        same(getattr(real, name)(), getattr(ours, name)(), name)
    f_real, f_ours = both("float64", (9,), 8)
    for name in ("sum", "max", "min", "mean", "argmax"):
        assert getattr(f_ours, name)() == pytest.approx(getattr(f_real, name)(), rel=1e-12), name
    same(-real, -ours, "negative")
    same(abs(real), abs(ours), "abs")
    with pytest.raises(ValueError):
        ours.reshape(5, -1)
    with pytest.raises(IndexError):
        ours[4]


def test_bytes_arrays_are_object_arrays():
    real = np.array([b"a", "é".encode(), b""], dtype=np.object_)
    ours = tnp.array([b"a", "é".encode(), b""], dtype=tnp.object_)
    assert ours.dtype.name == real.dtype.name == "object"
    assert ours[1] == real[1] and ours.tolist() == real.tolist()
    assert ours.reshape(3, 1)[2][0] == b""


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_numbers_to_text_read_as_numpys(name):
    # astype(np.bytes_) is how post-processing turns numbers into a BYTES output: float32 0.1
    # must be b"0.1" (numpy's shortest digits for the type), not the double's digits.
    rng = np.random.default_rng(7)
    values = [0.1, 1.0, -0.0, math.nan, -math.inf, 1e-4, 9.9e-5, 1000.0, 999999.9, 1e6, 1e15,
              1e16, 6e-8, -0.015625, 2.0 ** -12, 2.0 ** -14]
    values += [float(v) for v in rng.uniform(-1, 1, 3000) * 10.0 ** rng.integers(-9, 25, 3000)]
    values += [float(s) * 2.0 ** int(e) for s, e in zip(rng.choice([-1, 1], 500),
                                                          rng.integers(-24, 60, 500))]
    if name == "float16":
        values = [v for v in values if math.isnan(v) or math.isinf(v) or abs(v) < 65000]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = np.array(values, dtype=name)
    ours = tnp.array(values, dtype=name)
    for target in ("bytes_", "str_"):
        assert ours.astype(getattr(tnp, target)).tolist() == \
            real.astype(getattr(np, target)).tolist()


def test_text_conversions_of_ints_bools_and_objects_read_as_numpys():
    for values, dtype in (([1, -2, 3], "int64"), ([0, 255], "uint8"), ([True, False], "bool_")):
        real, ours = np.array(values, dtype=dtype), tnp.array(values, dtype=dtype)
        for target in ("bytes_", "str_"):
            assert ours.astype(getattr(tnp, target)).tolist() == \
                real.astype(getattr(np, target)).tolist()
        assert ours.astype(bytes).tolist() == real.astype(bytes).tolist()
        assert ours.astype(str).tolist() == real.astype(str).tolist()
    mixed = [b"x", 1, 2.5, None, "y"]
    for target in ("bytes_", "str_"):
        assert tnp.array(mixed, dtype=tnp.object_).astype(getattr(tnp, target)).tolist() == \
            np.array(mixed, dtype=np.object_).astype(getattr(np, target)).tolist()
    for values in ([1, 2.5, True, 1e20], ["ab", "c"], [b"x"]):
        for target in ("bytes_", "str_"):
            assert tnp.array(values, dtype=getattr(tnp, target)).tolist() == \
                np.array(values, dtype=getattr(np, target)).tolist()
    # An array inside a list keeps its dtype's digits; asarray, zeros, ones, full convert too.
    s32 = np.array([0.1, 0.7], dtype=np.float32)
    t32 = tnp.array([0.1, 0.7], dtype=tnp.float32)
    for target in ("bytes_", "str_"):
        assert tnp.array([t32, t32], dtype=getattr(tnp, target)).tolist() == \
            np.array([s32, s32], dtype=getattr(np, target)).tolist()
    mixed_real, mixed_ours = np.array([1.5, 2], dtype=object), tnp.array([1.5, 2], dtype=tnp.object_)
    for target in ("bytes_", "str_"):
        real_t, ours_t = getattr(np, target), getattr(snp, target)
        assert snp.asarray(mixed_ours, dtype=ours_t).tolist() == \
            np.asarray(mixed_real, dtype=real_t).tolist()
        assert snp.zeros(2, dtype=ours_t).tolist() == np.zeros(2, dtype=real_t).tolist()
        assert snp.ones(2, dtype=ours_t).tolist() == np.ones(2, dtype=real_t).tolist()
        assert snp.full(2, 3, dtype=ours_t).tolist() == np.full(2, 3, dtype=real_t).tolist()
        # (numpy cuts it to one character: its array is `S1`.)
        assert snp.full(2, 3.5, dtype=ours_t).tolist() == np.full(2, 3.5, dtype=real_t).tolist()
        for v in (5, 0, True, 1.5, "ab", b"ab"):
            assert ours_t(v) == real_t(v), (target, v)

    assert (tnp.array([1, 2]).astype(tnp.bytes_) == b"1").tolist() == [True, False]
    with pytest.raises(UnicodeEncodeError):
        tnp.array(["é"], dtype=tnp.bytes_)


@pytest.mark.parametrize("call", [
    lambda a: a.cumsum(), lambda a: a.sum(axis=(0, 1)), lambda a: a[..., 0],
    lambda a: a.__setitem__(0, 1), lambda a: a.dot(a), lambda a: a[[0, 1]],
])
def test_what_is_missing_fails_by_name(call):
    with pytest.raises(tnp.NotInSandbox, match="Python sandbox"):
        call(tnp.zeros((2, 2), dtype="float32"))


# --- pb_utils over real numpy -----------------------------------------------------------------

KSERVE = {"bool_": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
          "uint64": "UINT64", "int8": "INT8", "int16": "INT16", "int32": "INT32",
          "int64": "INT64", "float16": "FP16", "float32": "FP32", "float64": "FP64"}


@pytest.mark.parametrize("name", NUMERIC)
def test_tensors_round_trip_the_wire_in_numpy_and_in_the_stand_in(name):
    real, _ = both(name, (2, 3), 9)
    tensor = pb_utils.Tensor("x", real)
    w = tensor._wire
    assert w.datatype == KSERVE[name] and w.shape == [2, 3]
    assert w.raw == real.astype(real.dtype.newbyteorder("<")).tobytes()
    back = pb_utils.Tensor._from_wire(w).as_numpy()
    assert back.dtype == real.dtype and np.array_equal(back, real, equal_nan=True)
    back[0, 0] = back[0, 1]  # writable, as Triton's are
    # The stand-in reads the same bytes to the same values.
    ours = w.to_array(tnp)
    assert ours.dtype.name == real.dtype.name and ours.tolist() == real.tolist()
    assert wire.WireTensor.from_array("x", w.datatype, ours, tnp).raw == w.raw


def test_bytes_tensors_round_trip():
    real = np.array([[b"hello", "世界".encode()], [b"", b"\x00\xff"]], dtype=np.object_)
    tensor = pb_utils.Tensor("s", real)
    assert tensor._wire.datatype == "BYTES" and tensor._wire.elements[1] == "世界".encode()
    back = pb_utils.Tensor._from_wire(tensor._wire).as_numpy()
    assert back.dtype == np.object_ and back.shape == (2, 2) and back.tolist() == real.tolist()
    assert tensor._wire.to_array(tnp).tolist() == real.tolist()
    assert tensor.triton_dtype() == pb_utils.TRITONSERVER_TYPE_BYTES


def test_type_names_map_as_tritons_do():
    expected = {"TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
                "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
                "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
                "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
                "TYPE_STRING": np.object_}
    for triton, numpy_type in expected.items():
        assert pb_utils.triton_string_to_numpy(triton) is numpy_type, triton
        code = pb_utils.numpy_to_triton_type(numpy_type)
        assert pb_utils.triton_to_numpy_type(code) is numpy_type, triton
    assert pb_utils.numpy_to_triton_type(np.bytes_) == pb_utils.TRITONSERVER_TYPE_BYTES
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.triton_string_to_numpy("TYPE_BF17")


def test_byte_tensor_serialization_is_tritons():
    data = np.array([b"ab", b"", "é".encode()], dtype=np.object_)
    blob = pb_utils.serialize_byte_tensor(data)[0]
    assert blob == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 2) + "é".encode()
    assert pb_utils.deserialize_bytes_tensor(blob).tolist() == data.tolist()


def test_requests_responses_and_errors():
    a = pb_utils.Tensor("INPUT0", np.ones(4, dtype=np.float32))
    request = pb_utils.InferenceRequest(model_name=b"add_sub", requested_output_names=["OUTPUT0"],
                                        inputs=[a], parameters={"k": 1})
    assert request.model_name() == "add_sub"
    assert pb_utils.get_input_tensor_by_name(request, "INPUT0") is a
    assert pb_utils.get_input_tensor_by_name(request, "nope") is None
    calls = []

    def fake_infer(model, version, wire_request):
        calls.append((model, version, wire_request))
        if model == "missing":
            raise wire.InferError("model-not-found", "'missing' is not found")
        return [wire_request.inputs[0].renamed("OUTPUT0")], {"p": 2}

    real_infer, wire.infer = wire.infer, fake_infer
    try:
        response = request.exec()
        assert not response.has_error()
        out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
        assert np.array_equal(out.as_numpy(), np.ones(4, dtype=np.float32))
        assert calls[0][0] == "add_sub" and calls[0][1] is None
        assert calls[0][2].parameters == {"k": 1}
        failed = pb_utils.InferenceRequest(model_name="missing", inputs=[a],
                                           requested_output_names=[]).exec()
        assert failed.has_error() and failed.error().code() == pb_utils.TritonError.NOT_FOUND
        assert "not found" in failed.error().message()
    finally:
        wire.infer = real_infer
    config = {"input": [{"name": "INPUT0", "data_type": "TYPE_FP32"}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32"}],
              "model_transaction_policy": {"decoupled": True}}
    assert pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(config, "nope") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    with pytest.raises(pb_utils.TritonModelException, match="DLPack"):
        a.to_dlpack()
    with pytest.raises(pb_utils.TritonModelException, match="numpy array"):
        pb_utils.Tensor("x", [1, 2, 3])


# --- the sandbox's `numpy` package (guest-sdk-python/src/sandbox/numpy) -----------------------

def _sandbox_numpy():
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "guest-sdk-python" / "src" / "sandbox" / "numpy" / "__init__.py"
    spec = importlib.util.spec_from_file_location("tessera_sandbox_numpy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


snp = _sandbox_numpy()


@pytest.mark.parametrize("name", ["int32", "uint8", "float32", "float64", "bool_"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_along_an_axis(name, axis, keepdims):
    real, ours = both(name, (3, 4), 12)
    for fn in ("sum", "max", "min", "argmax", "argmin", "any", "all", "mean"):
        if fn in ("argmax", "argmin") and keepdims and axis is None:
            continue  # numpy 2 gives keepdims there too; not offered here
        expected = getattr(np, fn)(real, axis=axis, keepdims=keepdims) if fn not in ("argmax", "argmin") \
            else getattr(np, fn)(real, axis=axis, keepdims=keepdims)
        got = getattr(snp, fn)(ours, axis=axis, keepdims=keepdims)
        if fn == "mean" or (fn == "sum" and name.startswith("float")):
            assert np.allclose(np.asarray(got.tolist() if isinstance(got, tnp.ndarray) else got),
                               expected, rtol=1e-6), fn
            if isinstance(got, tnp.ndarray):
                assert got.dtype.name == np.asarray(expected).dtype.name and got.shape == expected.shape
        else:
            same(np.asarray(expected) if isinstance(got, tnp.ndarray) else expected, got,
                 f"{fn}({name}, axis={axis}, keepdims={keepdims})")


def test_concatenate_stack_and_shapes():
    ra, oa = both("float32", (2, 3), 13)
    rb, ob = both("int16", (2, 3), 14)
    for axis in (0, 1, -1):
        same(np.concatenate([ra, rb], axis=axis), snp.concatenate([oa, ob], axis=axis), f"cat {axis}")
    for axis in (0, 1, 2, -1):
        same(np.stack([ra, ra], axis=axis), snp.stack([oa, oa], axis=axis), f"stack {axis}")
    with pytest.raises(ValueError):
        snp.concatenate([oa, snp.zeros((3, 3))], axis=1)
    same(np.arange(5), snp.arange(5), "arange")
    same(np.arange(2, 11, 3, dtype=np.int32), snp.arange(2, 11, 3, dtype="int32"), "arange step")
    same(np.arange(0.0, 1.0, 0.25), snp.arange(0.0, 1.0, 0.25), "arange float")
    same(np.zeros_like(ra), snp.zeros_like(oa), "zeros_like")
    same(np.full((2, 2), 7, dtype=np.int8), snp.full((2, 2), 7, dtype="int8"), "full")


@pytest.mark.parametrize("name", ["float32", "float64", "int32"])
def test_elementwise_math_within_one_ulp(name):
    real, ours = both(name, (2, 5), 15)
    real, ours = abs(real) + 1, abs(ours) + 1
    for fn in ("exp", "log", "sqrt", "tanh", "sin", "cos", "floor", "ceil", "log2", "log10"):
        arg_r = real / 100 if fn == "exp" else real
        arg_o = ours / 100 if fn == "exp" else ours
        with np.errstate(all="ignore"):
            expected = getattr(np, fn)(arg_r)
        got = getattr(snp, fn)(arg_o)
        assert got.dtype.name == expected.dtype.name, fn
        if expected.dtype.kind in "iu":
            same(expected, got, fn)
            continue
        assert np.allclose(np.array(got.tolist(), dtype=expected.dtype), expected,
                           rtol=2 * np.finfo(expected.dtype).eps, atol=0, equal_nan=True), fn
    assert snp.exp(snp.array([1000.0], dtype="float32")).tolist() == [float("inf")]
    assert math.isnan(snp.log(snp.array([-1.0])).tolist()[0])


def test_softmax_argsort_where_and_friends():
    logits = np.array([[1.0, 3.0, 2.0, -1.0], [0.5, 0.5, 4.0, 1.0]], dtype=np.float32)
    ours = snp.array(logits.tolist(), dtype="float32")

    def softmax(m, x):
        e = m.exp(x - m.max(x, axis=-1, keepdims=True))
        return e / m.sum(e, axis=-1, keepdims=True)

    expected, got = softmax(np, logits), softmax(snp, ours)
    assert got.dtype.name == "float32" and got.shape == expected.shape
    assert np.allclose(np.array(got.tolist(), dtype=np.float32), expected, rtol=1e-6)
    same(np.argmax(logits, axis=-1), snp.argmax(ours, axis=-1), "argmax")
    same(np.argsort(logits[0]), snp.argsort(ours[0]), "argsort 1-D")
    same(np.argsort(logits, axis=-1, kind="stable"), snp.argsort(ours, axis=-1), "argsort 2-D")
    same(np.where(logits > 1, logits, 0), snp.where(ours > 1, ours, 0), "where")
    same(np.maximum(logits, 1.5), snp.maximum(ours, 1.5), "maximum")
    same(np.minimum(logits, logits[0]), snp.minimum(ours, ours[0]), "minimum")
    same(np.clip(logits, 0, 2), snp.clip(ours, 0, 2), "clip")
    ints = np.array([1, 5, -3], dtype=np.int32)
    same(np.clip(ints, 0, 2), snp.clip(snp.array([1, 5, -3], dtype="int32"), 0, 2), "clip int")
    assert snp.allclose(ours, ours + 1e-9) and not snp.allclose(ours, ours + 1)
    assert snp.array_equal(ours, ours) and not snp.array_equal(ours, ours[0])
    assert snp.float32 is tnp.float32 and snp.asarray(ours) is ours


def test_what_the_sandbox_numpy_lacks_is_named():
    assert not hasattr(snp, "linalg") and not hasattr(snp.zeros(2), "cumsum")
    with pytest.raises(tnp.NotInSandbox, match="numpy.einsum"):
        snp.einsum("ii", snp.zeros((2, 2)))
    with pytest.raises(tnp.NotInSandbox):
        snp.argsort(snp.zeros((2, 2)), axis=0)


class _FakeWireSender:
    """wire.WireSender's contract, recording what the host would receive."""

    def __init__(self, cancelled=False):
        self.sent, self.final_sent, self.cancelled = [], False, cancelled

    def send(self, outputs, parameters, final):
        if self.cancelled:
            raise wire.SendError("cancelled")
        self.sent.append(("response", [t.name for t in outputs], final))
        self.final_sent = self.final_sent or final

    def send_error(self, kind, message):
        self.sent.append(("error", kind, message))
        self.final_sent = True

    def finish(self):
        self.sent.append(("finish",))
        self.final_sent = True

    def is_cancelled(self):
        return self.cancelled


def test_the_response_sender_sends_as_tritons():
    fake = _FakeWireSender()
    sender = pb_utils.InferenceResponseSender(fake, requested_outputs=["A"])
    a = pb_utils.Tensor("A", np.array([1], np.int32))
    b = pb_utils.Tensor("B", np.array([2], np.int32))
    sender.send(pb_utils.InferenceResponse(output_tensors=[a, b]))  # B was not asked for
    sender.send(pb_utils.InferenceResponse(output_tensors=[a]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert fake.sent == [("response", ["A"], False), ("response", ["A"], True)]
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(pb_utils.InferenceResponse(output_tensors=[a]))

    flags_only = _FakeWireSender()
    pb_utils.InferenceResponseSender(flags_only, []).send(
        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert flags_only.sent == [("finish",)]
    with pytest.raises(pb_utils.TritonModelException, match="needs a response"):
        pb_utils.InferenceResponseSender(_FakeWireSender(), []).send()

    erring = _FakeWireSender()
    error = pb_utils.TritonError("no such thing", pb_utils.TritonError.NOT_FOUND)
    pb_utils.InferenceResponseSender(erring, []).send(pb_utils.InferenceResponse(error=error))
    assert erring.sent == [("error", "model-not-found", "no such thing")]


def test_a_cancelled_request_says_so_and_refuses_sends():
    fake = _FakeWireSender(cancelled=True)
    request = pb_utils.InferenceRequest(inputs=[])
    assert request.is_cancelled() is False  # not a decoupled model's request
    with pytest.raises(pb_utils.TritonModelException, match="needs a decoupled model"):
        request.get_response_sender()
    request._sender = pb_utils.InferenceResponseSender(fake, [])
    assert request.is_cancelled() is True
    assert request.get_response_sender().is_cancelled() is True
    with pytest.raises(pb_utils.TritonModelException, match="its caller has gone"):
        request.get_response_sender().send(
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("A", np.zeros(1))]))


def test_an_output_takes_the_declared_datatype_when_no_value_changes():
    # Triton's examples/bls_decoupled sums into np.array([0]) (int64) for an INT32 output.
    pb_utils._declare_outputs({"output": [{"name": "SUM", "data_type": "TYPE_INT32"},
                                          {"name": "TEXT", "data_type": "TYPE_STRING"}]})
    try:
        fits = pb_utils._wire_as_declared(pb_utils.Tensor("SUM", np.array([16], dtype=np.int64)))
        assert fits.datatype == "INT32"
        assert fits.to_array(np).tolist() == [16] and fits.to_array(np).dtype == np.int32
        # A value the declared type cannot hold stays as it is: the server refuses it by name.
        big = pb_utils._wire_as_declared(pb_utils.Tensor("SUM", np.array([2**40], dtype=np.int64)))
        assert big.datatype == "INT64"
        fraction = pb_utils._wire_as_declared(pb_utils.Tensor("SUM", np.array([0.5])))
        assert fraction.datatype == "FP64"
        # Undeclared outputs and strings pass as they are.
        other = pb_utils._wire_as_declared(pb_utils.Tensor("OTHER", np.array([1], dtype=np.int64)))
        assert other.datatype == "INT64"
        text = pb_utils._wire_as_declared(pb_utils.Tensor("TEXT", np.array([b"a"], dtype=np.object_)))
        assert text.datatype == "BYTES"
    finally:
        pb_utils._declare_outputs({})


def test_model_config_completes_as_tritons():
    """pb_utils.ModelConfig, as auto_complete_config uses it: fills what the configuration
    leaves open, raises ValueError on what contradicts it."""
    import json

    config = pb_utils.ModelConfig(json.dumps({"name": "m", "input": [], "output": [],
                                              "max_batch_size": 0}))
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})  # same: no-op
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict() == {
        "name": "m", "max_batch_size": 8, "dynamic_batching": {},
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
        "model_transaction_policy": {"decoupled": True},
    }
    # A tensor the configuration names without type and dims gets them.
    named = pb_utils.ModelConfig({"name": "m", "input": [{"name": "IN", "data_type":
                                                          "TYPE_INVALID", "dims": []}]})
    named.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [2]})
    assert named.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_INT8", "dims": [2]}]
    refusals = [
        (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]}),
         "configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT32"),
        (lambda c: c.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [5]}),
         "the model expects dims [5] but the model configuration specifies dims [4]"),
        (lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1],
                                "format": "FORMAT_NHWC"}), "contains property other than"),
        (lambda c: c.add_input({"name": "X", "dims": [1]}), "missing 'data_type' property"),
        (lambda c: c.set_max_batch_size(4), "configuration specified max_batch_size 8"),
        (lambda c: c.set_model_transaction_policy({"decoupled": False}), "decoupled property"),
        (lambda c: c.set_model_transaction_policy({"other": 1}), "other than 'decoupled'"),
    ]
    for attempt, message in refusals:
        with pytest.raises(ValueError, match=re.escape(message)):
            attempt(config)
    sequence = pb_utils.ModelConfig({"name": "m", "sequence_batching": {}})
    with pytest.raises(ValueError, match="sequence_batching"):
        sequence.set_dynamic_batching()


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
@pytest.mark.parametrize("scalar", [0.1, 0.7, 1e-8, 3, True])
def test_a_float_array_compares_with_a_python_scalar_cast_to_its_dtype(name, scalar):
    # numpy 2 (NEP 50): the Python scalar takes the array's dtype first, so float32 0.7 >= 0.7.
    values = [0.1, 0.7, 1e-8, 3.0, 1.0, -2.5]
    real, ours = np.array(values, dtype=name), tnp.array(values, dtype=name)
    for op in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
        same(getattr(real, op)(scalar), getattr(ours, op)(scalar), f"{name} {op} {scalar!r}")


def test_an_object_array_compares_elementwise_with_bytes_str_and_none():
    real = np.array([b"x", b"y", None], dtype=np.object_)
    ours = tnp.array([b"x", b"y", None], dtype="object_")
    for scalar in (b"x", "x", None):
        assert (ours == scalar).tolist() == (real == scalar).tolist(), scalar
        assert (ours != scalar).tolist() == (real != scalar).tolist(), scalar


@pytest.mark.parametrize("make", [
    lambda m: m.array([300], dtype="uint8"), lambda m: m.array([-1], dtype="uint32"),
    lambda m: m.full(3, 300, dtype="uint8"), lambda m: m.array([[1, 128]], dtype="int8"),
])
def test_a_python_int_out_of_the_dtypes_range_is_an_overflow_error_as_in_numpy(make):
    with pytest.raises(OverflowError):
        make(np)
    with pytest.raises(OverflowError):
        make(tnp)


@pytest.mark.parametrize("values", [[2**63], [2**64 - 1, 0], [-1, 2**63], [2**64], [1, -(2**63)]])
def test_python_ints_past_int64_take_numpys_dtype(values):
    assert tnp.array(values).dtype.name == np.array(values).dtype.name, values


def test_a_response_refuses_what_the_wire_cannot_carry_as_triton_does():
    out = pb_utils.Tensor("OUT", np.ones(2, dtype=np.float32))
    pb_utils.InferenceResponse([out], parameters={"s": "x", "i": -(1 << 63), "b": True, "f": 0.5})
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceResponse([out], parameters={"a": [1, 2]})
    with pytest.raises(pb_utils.TritonModelException, match="64-bit"):
        pb_utils.InferenceResponse([out], parameters={"a": 1 << 63})
    with pytest.raises(pb_utils.TritonModelException, match="keys to have type str"):
        pb_utils.InferenceResponse([out], parameters={1: "a"})
    with pytest.raises(TypeError, match="pb_utils.Tensor"):
        pb_utils.InferenceResponse(["OUT"])
    with pytest.raises(TypeError, match="name must be a str"):
        pb_utils.Tensor(b"OUT", np.ones(1))
