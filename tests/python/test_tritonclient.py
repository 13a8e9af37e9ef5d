"""Tessera against the real Python `tritonclient` (HTTP/REST, KServe v2 + Triton extensions).

Models (model_repository/, made by scripts/gen_models.py):
  add_sub          OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [-1, 16], max_batch_size 8
  mlp_classifier   INPUT FP32 [-1, 64] -> PROBS FP32 [-1, 10], labels.txt (classification extension)
  preprocess_text  (optional, Wasm tokenizer) TEXT BYTES [-1, 1] -> INPUT_IDS INT64 [-1, -1], ...
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import MODEL_REPOSITORY

ADD_SUB_INFER = "/v2/models/add_sub/infer"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def exact_fp32(rng: np.random.Generator, shape) -> np.ndarray:
    """FP32 values that survive JSON text and whose sums/differences are exact (k / 64)."""
    return (rng.integers(-4096, 4096, size=shape) / 64.0).astype(np.float32)


def add_sub_inputs(a: np.ndarray, b: np.ndarray, binary_data: bool):
    i0 = httpclient.InferInput("INPUT0", list(a.shape), "FP32")
    i0.set_data_from_numpy(a, binary_data=binary_data)
    i1 = httpclient.InferInput("INPUT1", list(b.shape), "FP32")
    i1.set_data_from_numpy(b, binary_data=binary_data)
    return [i0, i1]


def good_add_sub_json(batch: int = 1) -> dict:
    a = np.arange(batch * 16, dtype=np.float32).reshape(batch, 16)
    return {
        "inputs": [
            {"name": "INPUT0", "shape": [batch, 16], "datatype": "FP32", "data": a.flatten().tolist()},
            {"name": "INPUT1", "shape": [batch, 16], "datatype": "FP32", "data": [1.0] * (batch * 16)},
        ]
    }


def assert_still_serving(server, client) -> None:
    """After a bad request, a good add_sub request (raw JSON and via the client) must still work."""
    status, _, body = server.post_json(ADD_SUB_INFER, good_add_sub_json())
    assert status == 200, body
    out = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert out["OUTPUT0"]["data"] == [float(x + 1) for x in range(16)]
    assert out["OUTPUT1"]["data"] == [float(x - 1) for x in range(16)]

    a = np.full((2, 16), 3.0, np.float32)
    b = np.full((2, 16), 0.5, np.float32)
    r = client.infer("add_sub", add_sub_inputs(a, b, binary_data=True))
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


def assert_error(status: int, body: bytes, allowed) -> str:
    """The status is in `allowed` and the body is {"error": "<non-empty message>"}."""
    assert status in allowed, (status, body[:500])
    try:
        obj = json.loads(body)
    except ValueError:
        pytest.fail(f"error body is not JSON: {body[:500]!r}")
    assert isinstance(obj, dict) and "error" in obj, obj
    assert isinstance(obj["error"], str) and obj["error"].strip(), obj
    return obj["error"]


def labels_of(model: str) -> list[str]:
    return (MODEL_REPOSITORY / model / "labels.txt").read_text(encoding="utf-8").splitlines()


def as_text(x) -> str:
    return x.decode("utf-8") if isinstance(x, (bytes, bytearray)) else str(x)


# ---------------------------------------------------------------------------
# health and metadata
# ---------------------------------------------------------------------------

def test_server_live_and_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_model_ready(client):
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")


def test_server_metadata(client):
    md = client.get_server_metadata()
    assert isinstance(md.get("name"), str) and md["name"]
    assert isinstance(md.get("version"), str) and md["version"]
    assert isinstance(md.get("extensions"), list) and md["extensions"], md
    assert all(isinstance(e, str) and e for e in md["extensions"])


def test_model_metadata_add_sub(client):
    md = client.get_model_metadata("add_sub")
    assert md["name"] == "add_sub"
    assert md.get("platform") == "onnxruntime_onnx"  # Triton: the config's platform (or backend)
    if "versions" in md:
        assert "1" in md["versions"]
    for key, names in (("inputs", ["INPUT0", "INPUT1"]), ("outputs", ["OUTPUT0", "OUTPUT1"])):
        tensors = {t["name"]: t for t in md[key]}
        assert sorted(tensors) == names, md[key]
        for t in tensors.values():
            assert t["datatype"] == "FP32", t
            assert [int(d) for d in t["shape"]] == [-1, 16], t


def test_model_metadata_version(client):
    md = client.get_model_metadata("add_sub", model_version="1")
    assert md["name"] == "add_sub"


def test_model_config_add_sub(client):
    cfg = client.get_model_config("add_sub")
    cfg = cfg.get("config", cfg)  # tolerate a gRPC-style {"config": {...}} wrapper
    assert cfg["name"] == "add_sub"
    assert int(cfg["max_batch_size"]) == 8
    inputs = {t["name"]: t for t in cfg["input"]}
    assert sorted(inputs) == ["INPUT0", "INPUT1"]
    for t in inputs.values():
        assert t["data_type"] == "TYPE_FP32", t
        assert [int(d) for d in t["dims"]] == [16], t
    outputs = {t["name"]: t for t in cfg["output"]}
    assert sorted(outputs) == ["OUTPUT0", "OUTPUT1"]
    for t in outputs.values():
        assert [int(d) for d in t["dims"]] == [16], t


def test_model_config_classifier_labels(client):
    cfg = client.get_model_config("mlp_classifier")
    cfg = cfg.get("config", cfg)
    assert int(cfg["max_batch_size"]) == 64
    (out,) = cfg["output"]
    assert out["name"] == "PROBS"
    assert out.get("label_filename") == "labels.txt"


# ---------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("binary_data", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("batch", [1, 3])
def test_infer_add_sub(client, binary_data, batch):
    rng = np.random.default_rng(1000 + batch)
    a = exact_fp32(rng, (batch, 16))
    b = exact_fp32(rng, (batch, 16))
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_data),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary_data)]
    r = client.infer("add_sub", add_sub_inputs(a, b, binary_data), outputs=outputs)
    resp = r.get_response()
    assert resp["model_name"] == "add_sub"
    o0, o1 = r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")
    assert o0.dtype == np.float32 and o1.dtype == np.float32
    assert o0.shape == (batch, 16) and o1.shape == (batch, 16)
    np.testing.assert_array_equal(o0, a + b)
    np.testing.assert_array_equal(o1, a - b)
    for out in resp["outputs"]:
        assert out["datatype"] == "FP32"
        assert [int(d) for d in out["shape"]] == [batch, 16]
        if binary_data:
            assert out["parameters"]["binary_data_size"] == batch * 16 * 4
        else:
            assert "data" in out


@pytest.mark.parametrize("binary_data", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("request_compression, response_compression", [
    ("gzip", None), ("deflate", None), (None, "gzip"), (None, "deflate"), ("gzip", "gzip")])
def test_compressed_requests_and_answers(server, client, binary_data, request_compression,
                                         response_compression):
    """tritonclient's request_compression_algorithm and response_compression_algorithm, as
    Triton's HTTP front-end takes them (the body was read compressed, and failed, before)."""
    rng = np.random.default_rng(5)
    a = exact_fp32(rng, (2, 16))
    b = exact_fp32(rng, (2, 16))
    r = client.infer("add_sub", add_sub_inputs(a, b, binary_data),
                     request_compression_algorithm=request_compression,
                     response_compression_algorithm=response_compression)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    if response_compression:
        body = json.dumps({"inputs": [
            {"name": n, "shape": [2, 16], "datatype": "FP32", "data": v.ravel().tolist()}
            for n, v in (("INPUT0", a), ("INPUT1", b))]}).encode()
        status, headers, _ = server.request(
            "POST", "/v2/models/add_sub/infer", body,
            {"Content-Type": "application/json", "Accept-Encoding": response_compression})
        assert status == 200 and headers.get("content-encoding") == response_compression
        # Only inference answers, as Triton's: tritonclient's asyncio client sends aiohttp's
        # default Accept-Encoding and parses the other answers as they come.
        status, headers, data = server.request("GET", "/v2/models/add_sub/stats", None,
                                               {"Accept-Encoding": response_compression})
        assert status == 200 and "content-encoding" not in headers
        assert json.loads(data)["model_stats"]


def test_a_compressed_body_is_bounded_once_decompressed(server):
    """A gzip body of 100 KB that decompresses to 100 MB is read only as far as
    --http-max-input-size (64 MiB here): 413, and the server goes on."""
    import gzip

    bomb = gzip.compress(b"\0" * 100_000_000, compresslevel=9)
    assert len(bomb) < 200_000
    status, _, body = server.request("POST", "/v2/models/add_sub/infer", bomb,
                                     {"Content-Type": "application/json",
                                      "Content-Encoding": "gzip"})
    assert status == 413, (status, body[:200])
    assert b"--http-max-input-size" in body
    assert server.request("GET", "/v2/health/ready")[0] == 200


@pytest.mark.parametrize("path", ["/v2/models/add_sub/infer", "/v1/completions"])
def test_a_body_in_an_encoding_the_server_does_not_read_is_a_415_with_the_apis_error(
        server, path):
    """Content-Encoding: br is not read: 415 naming it and what is read, in the route's own
    error shape (KServe's `error` string, OpenAI's `error` object), not a plain-text body."""
    status, _, body = server.request("POST", path, b"\x0b\x02\x80{}\x03",
                                     {"Content-Type": "application/json",
                                      "Content-Encoding": "br"})
    assert status == 415, (status, body[:200])
    error = json.loads(body)["error"]
    message = error["message"] if path.startswith("/v1/") else error
    assert "'br'" in message and "gzip" in message, message
    assert server.request("GET", "/v2/health/ready")[0] == 200


def test_infer_add_sub_default_outputs(client):
    """No `outputs` in the request: every output comes back."""
    a = np.ones((2, 16), np.float32)
    b = np.full((2, 16), 2.0, np.float32)
    r = client.infer("add_sub", add_sub_inputs(a, b, binary_data=True))
    assert sorted(o["name"] for o in r.get_response()["outputs"]) == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


def test_infer_add_sub_explicit_version(client):
    a = np.ones((1, 16), np.float32)
    r = client.infer("add_sub", add_sub_inputs(a, a, binary_data=False), model_version="1")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + a)
    assert r.get_response().get("model_version") in (None, "1")


@pytest.mark.parametrize("binary_data", [False, True], ids=["json", "binary"])
def test_requested_output_subset(client, binary_data):
    rng = np.random.default_rng(7)
    a = exact_fp32(rng, (2, 16))
    b = exact_fp32(rng, (2, 16))
    r = client.infer("add_sub", add_sub_inputs(a, b, binary_data),
                     outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary_data)])
    names = [o["name"] for o in r.get_response()["outputs"]]
    assert names == ["OUTPUT1"]
    assert r.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


def test_request_id_echoed(client):
    a = np.ones((1, 16), np.float32)
    r = client.infer("add_sub", add_sub_inputs(a, a, binary_data=True), request_id="tessera-req-42")
    assert r.get_response().get("id") == "tessera-req-42"


def test_request_id_echoed_raw_json(server):
    body = good_add_sub_json()
    body["id"] = "raw-id-7"
    status, _, data = server.post_json(ADD_SUB_INFER, body)
    assert status == 200, data
    assert json.loads(data)["id"] == "raw-id-7"


@pytest.mark.parametrize("binary_data", [True, False], ids=["binary", "json"])
def test_classification_class_count(client, binary_data):
    labels = labels_of("mlp_classifier")
    assert len(labels) == 10
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)

    raw = client.infer("mlp_classifier", [inp],
                       outputs=[httpclient.InferRequestedOutput("PROBS", binary_data=True)]).as_numpy("PROBS")
    assert raw.shape == (4, 10) and raw.dtype == np.float32
    np.testing.assert_allclose(raw.sum(axis=1), 1.0, rtol=1e-5)

    r = client.infer("mlp_classifier", [inp], outputs=[
        httpclient.InferRequestedOutput("PROBS", binary_data=binary_data, class_count=3)])
    (out_meta,) = r.get_response()["outputs"]
    assert out_meta["datatype"] == "BYTES"
    cls = r.as_numpy("PROBS")
    assert cls.shape == (4, 3), cls.shape
    for row in range(4):
        expected = np.argsort(-raw[row], kind="stable")[:3]
        got_idx = []
        for k in range(3):
            score_s, idx_s, label = as_text(cls[row, k]).split(":", 2)
            idx = int(idx_s)
            got_idx.append(idx)
            assert label == labels[idx]
            assert np.isclose(float(score_s), raw[row, idx], rtol=1e-5, atol=1e-6), (score_s, raw[row, idx])
        assert got_idx == expected.tolist(), (got_idx, raw[row])


# ---------------------------------------------------------------------------
# BYTES (UTF-8 text) round trip on the Wasm tokenizer
# ---------------------------------------------------------------------------

TEXTS = ["슈퍼 엔저 장기화에…한국 수출∙경상수지에 비상등", "The quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def preprocess_text(server):
    status, _, body = server.request("GET", "/v2/models/preprocess_text")
    if status == 404:
        pytest.skip("preprocess_text is not in the server's model repository")
    assert status == 200, body
    return json.loads(body)


def _check_text_outputs(md: dict, outputs: dict, batch: int) -> None:
    names = {o["name"] for o in md["outputs"]}
    assert names and set(outputs) == names, (set(outputs), names)
    for name, arr in outputs.items():
        assert arr is not None and arr.shape[0] == batch, (name, None if arr is None else arr.shape)
    if "INPUT_IDS" in outputs:
        ids = outputs["INPUT_IDS"]
        assert ids.dtype == np.int64 and ids.ndim == 2, (ids.dtype, ids.shape)
        # the two texts differ, so their token ids differ
        assert not np.array_equal(ids[0], ids[1])


@pytest.mark.parametrize("binary_data", [True, False], ids=["binary", "json"])
def test_bytes_round_trip_preprocess_text(client, preprocess_text, binary_data):
    text = np.array([[t.encode("utf-8")] for t in TEXTS], dtype=np.object_)
    inp = httpclient.InferInput("TEXT", list(text.shape), "BYTES")
    inp.set_data_from_numpy(text, binary_data=binary_data)
    r = client.infer("preprocess_text", [inp])
    outputs = {o["name"]: r.as_numpy(o["name"]) for o in r.get_response()["outputs"]}
    _check_text_outputs(preprocess_text, outputs, batch=2)


def test_bytes_nested_json_data_preprocess_text(server, preprocess_text):
    """The curl form from Triton tutorials: nested `data`, Korean UTF-8 strings."""
    body = {"inputs": [{"name": "TEXT", "shape": [2, 1], "datatype": "BYTES",
                        "data": [[TEXTS[0]], [TEXTS[1]]]}]}
    status, _, data = server.request("POST", "/v2/models/preprocess_text/infer",
                                     json.dumps(body, ensure_ascii=False).encode("utf-8"),
                                     {"Content-Type": "application/json"})
    assert status == 200, data
    resp = json.loads(data)
    names = {o["name"] for o in preprocess_text["outputs"]}
    assert {o["name"] for o in resp["outputs"]} == names
    for o in resp["outputs"]:
        assert int(o["shape"][0]) == 2


# ---------------------------------------------------------------------------
# bad requests: clear 4xx errors, and the server keeps serving
# ---------------------------------------------------------------------------

# Checked against real Triton 2.51 (Python-backend twins of these models): every
# bad-request test below passes there too, except two where Triton answers 500
# and Tessera deliberately answers 400 (a client error): malformed JSON, and a
# `data` array whose length does not match `shape`.

def test_malformed_json(server, client):
    # Triton 2.51: 500 "failed to parse the request JSON buffer"; Tessera: 400.
    status, _, body = server.post_json(ADD_SUB_INFER, b'{"inputs": [{"name": "INPUT0", ')
    assert_error(status, body, (400,))
    assert_still_serving(server, client)


def test_wrong_datatype(server, client):
    req = good_add_sub_json()
    req["inputs"][0]["datatype"] = "INT32"
    req["inputs"][0]["data"] = list(range(16))
    status, _, body = server.post_json(ADD_SUB_INFER, req)
    assert_error(status, body, (400,))
    assert_still_serving(server, client)


def test_wrong_datatype_client(client, server):
    a = np.ones((1, 16), np.int32)
    i0 = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    i0.set_data_from_numpy(a, binary_data=True)
    i1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    i1.set_data_from_numpy(a, binary_data=True)
    with pytest.raises(InferenceServerException) as ei:
        client.infer("add_sub", [i0, i1])
    assert ei.value.status() in ("400", 400, None)
    assert str(ei.value).strip()
    assert_still_serving(server, client)


def test_wrong_shape(server, client):
    req = good_add_sub_json()
    for t in req["inputs"]:
        t["shape"] = [1, 15]
        t["data"] = t["data"][:15]
    status, _, body = server.post_json(ADD_SUB_INFER, req)
    assert_error(status, body, (400,))
    assert_still_serving(server, client)


def test_data_count_does_not_match_shape(server, client):
    # Triton 2.51: 500 "Unable to parse 'data': Shape does not match ..."; Tessera: 400.
    req = good_add_sub_json()
    req["inputs"][0]["data"] = req["inputs"][0]["data"][:15]
    status, _, body = server.post_json(ADD_SUB_INFER, req)
    assert_error(status, body, (400,))
    assert_still_serving(server, client)


def test_missing_input(server, client):
    req = good_add_sub_json()
    del req["inputs"][1]
    status, _, body = server.post_json(ADD_SUB_INFER, req)
    assert_error(status, body, (400,))
    assert_still_serving(server, client)


def test_batch_larger_than_max_batch_size(server, client):
    status, _, body = server.post_json(ADD_SUB_INFER, good_add_sub_json(batch=9))
    assert_error(status, body, (400,))
    assert_still_serving(server, client)


def test_batch_at_max_batch_size(server):
    status, _, body = server.post_json(ADD_SUB_INFER, good_add_sub_json(batch=8))
    assert status == 200, body


def test_unknown_model(server, client):
    status, _, body = server.post_json("/v2/models/no_such_model/infer", good_add_sub_json())
    assert_error(status, body, (400, 404))
    status, _, body = server.request("GET", "/v2/models/no_such_model")
    assert_error(status, body, (400, 404))
    assert_still_serving(server, client)


def test_unknown_model_client(client):
    with pytest.raises(InferenceServerException) as ei:
        client.get_model_metadata("no_such_model")
    assert str(ei.value).strip()


def test_unknown_version(server, client):
    status, _, body = server.post_json("/v2/models/add_sub/versions/999/infer", good_add_sub_json())
    assert_error(status, body, range(400, 500))
    status, _, body = server.request("GET", "/v2/models/add_sub/versions/999")
    assert_error(status, body, range(400, 500))
    assert_still_serving(server, client)


def _binary_request(header_len_delta: int = 0, drop_tail: int = 0) -> tuple[bytes, dict]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
    ]}).encode()
    body = header + a.tobytes() + a.tobytes()
    if drop_tail:
        body = body[:-drop_tail]
    headers = {"Content-Type": "application/octet-stream",
               "Inference-Header-Content-Length": str(len(header) + header_len_delta)}
    return body, headers


def test_binary_request_well_formed(server):
    """Control for the truncated-body tests: the same request, intact, succeeds."""
    body, headers = _binary_request()
    status, _, data = server.request("POST", ADD_SUB_INFER, body, headers)
    assert status == 200, data
    out = {o["name"]: o for o in json.loads(data)["outputs"]}
    assert out["OUTPUT0"]["data"] == [2.0 * i for i in range(16)]


def test_inference_header_length_larger_than_body(server, client):
    body, headers = _binary_request()
    headers["Inference-Header-Content-Length"] = str(len(body) + 100)
    status, _, data = server.request("POST", ADD_SUB_INFER, body, headers)
    assert_error(status, data, (400,))
    assert_still_serving(server, client)


def test_truncated_binary_tensor_data(server, client):
    body, headers = _binary_request(drop_tail=10)
    status, _, data = server.request("POST", ADD_SUB_INFER, body, headers)
    assert_error(status, data, (400,))
    assert_still_serving(server, client)


def test_binary_data_size_mismatch(server, client):
    """binary_data_size that is not shape x element size."""
    a = np.arange(16, dtype=np.float32)
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 60}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 68}},
    ]}).encode()
    body = header + a.tobytes() + a.tobytes()
    status, _, data = server.request("POST", ADD_SUB_INFER, body, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header))})
    assert_error(status, data, (400,))
    assert_still_serving(server, client)


def test_bad_inference_header_length_value(server, client):
    body, headers = _binary_request()
    headers["Inference-Header-Content-Length"] = "not-a-number"
    status, _, data = server.request("POST", ADD_SUB_INFER, body, headers)
    assert_error(status, data, (400,))
    assert_still_serving(server, client)


def test_sequential_mixed_requests_after_errors(server, client):
    """Alternating bad and good requests: errors leave no state behind."""
    bad = good_add_sub_json(batch=9)
    for _ in range(5):
        status, _, body = server.post_json(ADD_SUB_INFER, bad)
        assert_error(status, body, (400,))
        status, _, body = server.post_json(ADD_SUB_INFER, good_add_sub_json(batch=2))
        assert status == 200, body


def test_nan_and_infinities_travel_as_json_the_way_triton_writes_them(client):
    """tritonclient with binary_data=False writes NaN and infinities as Python's json does
    (`NaN`, `Infinity`, `-Infinity`), and Triton writes them back the same way (rapidjson's
    NaN-and-Inf flags); they used to be refused on the way in and written as null on the way
    out. Overflow in float32 arithmetic (3e38 + 3e38) is an infinity too."""
    a = np.array([[np.nan, np.inf, -np.inf, 3e38] + [1.0] * 12], dtype=np.float32)
    b = np.array([[1.0, 1.0, 1.0, 3e38] + [1.0] * 12], dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("OUTPUT0", "OUTPUT1")]
    r = client.infer("add_sub", add_sub_inputs(a, b, binary_data=False), outputs=outputs)
    total, diff = r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")
    assert np.isnan(total[0, 0]) and np.isnan(diff[0, 0])
    assert total[0, 1] == np.inf and total[0, 2] == -np.inf and total[0, 3] == np.inf
    assert diff[0, 3] == 0.0
    assert (total[0, 4:] == 2.0).all()
