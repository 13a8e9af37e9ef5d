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


@pytest.mark.parametrize("call", [
    lambda a: a.cumsum(), lambda a: a.sum(axis=0), lambda a: a[..., 0],
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
