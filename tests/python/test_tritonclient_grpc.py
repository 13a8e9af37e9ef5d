"""Tessera against the real Python `tritonclient.grpc` (KServe v2 over gRPC, Triton's
`inference.GRPCInferenceService`): the same compatibility checks as test_tritonclient.py over
HTTP, every datatype through an ONNX Identity model deployed over gRPC, and the bidirectional
stream with several requests in flight.
"""
from __future__ import annotations

import json
import queue

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from conftest import MODEL_REPOSITORY, in_threads


@pytest.fixture(scope="session")
def grpc(server):
    if server.grpc_port is None:
        pytest.skip("TESSERA_URL points at an external server; its gRPC port is unknown")
    c = grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
    yield c
    c.close()


def add_sub_inputs(a: np.ndarray, b: np.ndarray):
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        t = grpcclient.InferInput(name, list(value.shape), "FP32")
        t.set_data_from_numpy(value)
        inputs.append(t)
    return inputs


def status_of(e: InferenceServerException) -> str:
    return str(e.status())


def assert_still_serving(grpc) -> None:
    a = np.full((2, 16), 3.0, np.float32)
    b = np.full((2, 16), 0.5, np.float32)
    r = grpc.infer("add_sub", add_sub_inputs(a, b))
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)


# ---------------------------------------------------------------------------
# health, metadata, configuration, statistics
# ---------------------------------------------------------------------------

def test_server_live_ready_and_metadata(grpc):
    assert grpc.is_server_live()
    assert grpc.is_server_ready()
    md = grpc.get_server_metadata(as_json=True)
    assert md["name"] == "tessera"
    assert "model_repository" in md["extensions"]
    assert grpc.is_model_ready("add_sub")
    assert not grpc.is_model_ready("no_such_model")


def test_model_metadata(grpc):
    md = grpc.get_model_metadata("add_sub", as_json=True)
    assert md["name"] == "add_sub"
    assert md["versions"] == ["1"]
    assert [i["name"] for i in md["inputs"]] == ["INPUT0", "INPUT1"]
    for t in md["inputs"] + md["outputs"]:
        assert t["datatype"] == "FP32"
        assert [int(d) for d in t["shape"]] == [-1, 16]
    assert grpc.get_model_metadata("add_sub", model_version="1", as_json=True)["name"] == "add_sub"


def test_model_config_decodes_with_tritons_schema(grpc):
    config = grpc.get_model_config("add_sub", as_json=True)["config"]
    assert config["name"] == "add_sub"
    assert int(config["max_batch_size"]) == 8
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in config["input"][0]["dims"]] == [16]


def test_statistics_count_grpc_requests(grpc):
    before = grpc.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    a = np.ones((1, 16), np.float32)
    for _ in range(3):
        grpc.infer("add_sub", add_sub_inputs(a, a))
    after = grpc.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) >= int(before.get("inference_count", 0)) + 3
    assert int(after["inference_stats"]["success"]["count"]) >= 3
    every = grpc.get_inference_statistics(as_json=True)["model_stats"]
    assert any(m["name"] == "add_sub" for m in every)


def test_repository_index(grpc):
    rows = grpc.get_model_repository_index(as_json=True)["models"]
    assert any(r["name"] == "add_sub" and r.get("state") == "READY" for r in rows)


# ---------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 3])
def test_infer_add_sub(grpc, batch):
    rng = np.random.default_rng(2000 + batch)
    a = rng.standard_normal((batch, 16)).astype(np.float32)
    b = rng.standard_normal((batch, 16)).astype(np.float32)
    r = grpc.infer("add_sub", add_sub_inputs(a, b), request_id=f"grpc-{batch}")
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(r.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    resp = r.get_response(as_json=True)
    assert resp["model_name"] == "add_sub"
    assert resp["id"] == f"grpc-{batch}"


def test_gzip_compressed_requests(grpc):
    a = np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)
    r = grpc.infer("add_sub", add_sub_inputs(a, a), compression_algorithm="gzip")
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + a, rtol=1e-6)


def test_requested_output_subset_and_version(grpc):
    a = np.ones((2, 16), np.float32)
    r = grpc.infer("add_sub", add_sub_inputs(a, a), model_version="1",
                   outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert r.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - a)


def test_classification_class_count(grpc):
    labels = (MODEL_REPOSITORY / "mlp_classifier" / "labels.txt").read_text().splitlines()
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    raw = grpc.infer("mlp_classifier", [inp]).as_numpy("PROBS")
    r = grpc.infer("mlp_classifier", [inp],
                   outputs=[grpcclient.InferRequestedOutput("PROBS", class_count=3)])
    cls = r.as_numpy("PROBS")
    assert cls.shape == (4, 3)
    for row in range(4):
        expected = np.argsort(-raw[row], kind="stable")[:3].tolist()
        got = []
        for k in range(3):
            score, idx, label = cls[row, k].decode().split(":", 2)
            got.append(int(idx))
            assert label == labels[int(idx)]
            assert np.isclose(float(score), raw[row, int(idx)], rtol=1e-5, atol=1e-6)
        assert got == expected


DTYPES = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
          np.int64, np.float16, np.float32, np.float64, np.object_]
ONNX_TYPES = {np.bool_: TensorProto.BOOL, np.uint8: TensorProto.UINT8,
              np.uint16: TensorProto.UINT16, np.uint32: TensorProto.UINT32,
              np.uint64: TensorProto.UINT64, np.int8: TensorProto.INT8,
              np.int16: TensorProto.INT16, np.int32: TensorProto.INT32,
              np.int64: TensorProto.INT64, np.float16: TensorProto.FLOAT16,
              np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
              np.object_: TensorProto.STRING}


def triton_name(dtype) -> str:
    return np_to_triton_dtype(np.dtype(dtype))


@pytest.fixture(scope="module")
def identity_all(grpc):
    """An ONNX model with one Identity per datatype, deployed over gRPC (`load_model` with
    files), unloaded afterwards."""
    nodes, inputs, outputs, config_in, config_out = [], [], [], [], []
    for dtype in DTYPES:
        name = triton_name(dtype)
        inputs.append(helper.make_tensor_value_info(f"IN_{name}", ONNX_TYPES[dtype], [-1]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{name}", ONNX_TYPES[dtype], [-1]))
        nodes.append(helper.make_node("Identity", [f"IN_{name}"], [f"OUT_{name}"]))
        config_type = "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}"
        config_in.append({"name": f"IN_{name}", "data_type": config_type, "dims": [-1]})
        config_out.append({"name": f"OUT_{name}", "data_type": config_type, "dims": [-1]})
    graph = helper.make_graph(nodes, "identity_all", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    config = {"name": "identity_all", "platform": "onnxruntime_onnx", "max_batch_size": 0,
              "input": config_in, "output": config_out}
    grpc.load_model("identity_all", config=json.dumps(config),
                    files={"file:1/model.onnx": model.SerializeToString()})
    assert grpc.is_model_ready("identity_all")
    yield "identity_all"
    grpc.unload_model("identity_all")


def sample(dtype) -> np.ndarray:
    if dtype is np.bool_:
        return np.array([True, False, True])
    if dtype is np.object_:
        return np.array(["tessera".encode(), "é∙한".encode(), b""], dtype=np.object_)
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else np.finfo(dtype)
    return np.array([info.min, 0, info.max], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=[triton_name(d) for d in DTYPES])
def test_every_datatype_round_trips(grpc, identity_all, dtype):
    name = triton_name(dtype)
    value = sample(dtype)
    inputs = []
    for other in DTYPES:
        t = grpcclient.InferInput(f"IN_{triton_name(other)}", [3], triton_name(other))
        t.set_data_from_numpy(value if other is dtype else sample(other))
        inputs.append(t)
    r = grpc.infer(identity_all, inputs,
                   outputs=[grpcclient.InferRequestedOutput(f"OUT_{name}")])
    got = r.as_numpy(f"OUT_{name}")
    assert got.dtype == value.dtype or dtype is np.object_
    np.testing.assert_array_equal(got, value)


# ---------------------------------------------------------------------------
# errors: the gRPC codes Triton uses, and the server keeps serving
# ---------------------------------------------------------------------------

def test_unknown_model_and_version(grpc):
    a = np.ones((1, 16), np.float32)
    with pytest.raises(InferenceServerException) as e:
        grpc.infer("no_such_model", add_sub_inputs(a, a))
    assert status_of(e.value) == "StatusCode.NOT_FOUND"
    assert "not found" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc.infer("add_sub", add_sub_inputs(a, a), model_version="999")
    assert status_of(e.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        grpc.get_model_metadata("no_such_model")
    assert status_of(e.value) == "StatusCode.NOT_FOUND"
    assert_still_serving(grpc)


@pytest.mark.parametrize("case", ["datatype", "shape", "missing", "batch"])
def test_bad_requests_are_invalid_arguments(grpc, case):
    a = np.ones((1, 16), np.float32)
    if case == "datatype":
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            t = grpcclient.InferInput(name, [1, 16], "INT32")
            t.set_data_from_numpy(np.ones((1, 16), np.int32))
            inputs.append(t)
    elif case == "shape":
        b = np.ones((1, 15), np.float32)
        inputs = add_sub_inputs(b, b)
    elif case == "missing":
        inputs = add_sub_inputs(a, a)[:1]
    else:
        big = np.ones((9, 16), np.float32)
        inputs = add_sub_inputs(big, big)
    with pytest.raises(InferenceServerException) as e:
        grpc.infer("add_sub", inputs)
    assert status_of(e.value) == "StatusCode.INVALID_ARGUMENT", e.value
    assert e.value.message().strip()
    assert_still_serving(grpc)


def test_cuda_shared_memory_is_refused_clearly(grpc):
    with pytest.raises(InferenceServerException) as e:
        grpc.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64)
    assert "not supported" in e.value.message()


# ---------------------------------------------------------------------------
# the bidirectional stream
# ---------------------------------------------------------------------------

def test_stream_answers_in_order_with_errors_in_band(server):
    client = grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = []
    try:
        for i in range(24):
            a = np.full((1, 16), float(i), np.float32)
            # Every sixth request names a model that does not exist: its error comes back
            # in its place and the stream goes on.
            model = "no_such_model" if i % 6 == 5 else "add_sub"
            client.async_stream_infer(model, add_sub_inputs(a, a), request_id=str(i))
            sent.append((i, model))
        got = [answers.get(timeout=30) for _ in sent]
    finally:
        client.stop_stream()
        client.close()
    for (i, model), (result, error) in zip(sent, got):
        if model == "add_sub":
            assert error is None, error
            assert result.get_response().id == str(i)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"),
                                          np.full((1, 16), 2.0 * i, np.float32))
        else:
            assert result is None and error is not None
            assert "not found" in error.message()


def test_several_streams_at_once(server):
    """Four streams, each with eight requests in flight, all answered with their own data."""
    failures = []

    def run(k: int) -> None:
        client = grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for i in range(8):
                a = np.full((1, 16), float(100 * k + i), np.float32)
                client.async_stream_infer("add_sub", add_sub_inputs(a, a), request_id=str(i))
            for i in range(8):
                result, error = answers.get(timeout=30)
                if error is not None or result.get_response().id != str(i) or not np.array_equal(
                        result.as_numpy("OUTPUT0"), np.full((1, 16), 2.0 * (100 * k + i))):
                    failures.append((k, i, error))
        except Exception as e:  # noqa: BLE001 - a thread's failure must reach the assertion
            failures.append((k, "exception", repr(e)))
        finally:
            client.stop_stream()
            client.close()

    in_threads(run, 4)
    assert failures == []
