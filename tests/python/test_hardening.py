"""Hardening checks with Triton's own clients: byte strings into ONNX Runtime, Triton's version
wording, bounded gRPC errors and metadata, and KServe error bodies on every route."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import grpc as grpc_lib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from conftest import binary, launch, metric, stop, wait_for

STRING_IDENTITY_CONFIG = """
name: "string_identity"
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def _string_identity_model(path: Path) -> None:
    """An ONNX Identity over a string tensor, made here with the `onnx` package."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["TEXT"], ["TEXT_OUT"])],
        "string_identity",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("TEXT_OUT", TensorProto.STRING, ["batch", "n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def strings_server():
    """A server with only `string_identity`."""
    repo = Path(tempfile.mkdtemp(prefix="tessera-strings-"))
    model = repo / "string_identity"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(STRING_IDENTITY_CONFIG)
    _string_identity_model(model / "1" / "model.onnx")
    srv, proc, log = launch(binary(), ["--model-repository", str(repo)])
    try:
        yield srv
    finally:
        stop(proc, log)
        shutil.rmtree(repo, ignore_errors=True)


# NUL inside an element, bytes that are not UTF-8, an empty element, plain text.
AWKWARD = [b"a\x00b", b"\xff\xfe\x00\x80", b"", "naïve".encode()]


@pytest.mark.parametrize("binary_data", [True, False])
def test_bytes_with_nul_and_non_utf8_pass_through_onnx_exactly(strings_server, binary_data):
    client = httpclient.InferenceServerClient(strings_server.url)
    elements = AWKWARD if binary_data else [b"a\x00b", "naïve".encode()]
    data = np.array([elements], dtype=np.object_)
    inp = httpclient.InferInput("TEXT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, binary_data=binary_data)
    out = httpclient.InferRequestedOutput("TEXT_OUT", binary_data=True)
    result = client.infer("string_identity", [inp], outputs=[out])
    assert result.as_numpy("TEXT_OUT").tolist() == [elements]


def test_bytes_with_nul_and_non_utf8_over_grpc(strings_server):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{strings_server.grpc_port}")
    data = np.array([AWKWARD, AWKWARD[::-1]], dtype=np.object_)
    inp = grpcclient.InferInput("TEXT", list(data.shape), np_to_triton_dtype(data.dtype))
    inp.set_data_from_numpy(data)
    result = client.infer("string_identity", [inp])
    assert result.as_numpy("TEXT_OUT").tolist() == data.tolist()


@pytest.mark.parametrize("field", [
    'default_model_filename: "/etc/passwd"',
    'default_model_filename: "../../../../etc/passwd"',
    'output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ -1 ] label_filename: "/etc/passwd" } ]',
    'model_warmup [ { name: "w" batch_size: 1 inputs { key: "TEXT" value: { data_type: TYPE_STRING '
    'dims: [ 1 ] input_data_file: "../../../../../etc/passwd" } } } ]',
])
def test_a_config_cannot_make_the_server_read_a_file_outside_the_model(strings_server, field):
    # A load with a config override (a deployment's config the same): label files, the model
    # file and warmup data would hand the file back to the caller.
    text = STRING_IDENTITY_CONFIG.replace(
        'output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ -1 ] } ]', "")
    config = text + "\n" + field
    if "output [" not in config:
        config += '\noutput [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ -1 ] } ]'
    parsed = _pbtxt_to_json(config)
    status, _, body = strings_server.post_json(
        "/v2/repository/models/string_identity/load",
        {"parameters": {"config": json.dumps(parsed)}})
    assert status == 400, body
    error = json.loads(body)["error"]
    assert "inside the model's folder" in error and "root:" not in error, error
    # What served goes on serving.
    client = httpclient.InferenceServerClient(strings_server.url)
    data = np.array([[b"still"]], dtype=np.object_)
    inp = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(data)
    assert client.infer("string_identity", [inp]).as_numpy("TEXT_OUT").tolist() == [[b"still"]]


def test_a_config_asking_for_too_many_instances_is_refused_before_any_is_made(strings_server):
    config = _pbtxt_to_json(STRING_IDENTITY_CONFIG + "\ninstance_group [ { count: 100000 kind: KIND_CPU } ]")
    status, _, body = strings_server.post_json(
        "/v2/repository/models/string_identity/load",
        {"parameters": {"config": json.dumps(config)}})
    assert status == 400, body
    assert "--max-instances-per-model" in json.loads(body)["error"], body
    # No thread was started for them, and what served goes on serving.
    threads = len(list(Path(f"/proc/{strings_server.process.pid}/task").iterdir()))
    assert threads < 200, threads
    client = httpclient.InferenceServerClient(strings_server.url)
    inp = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"x"]], dtype=np.object_))
    assert client.infer("string_identity", [inp]).as_numpy("TEXT_OUT").tolist() == [[b"x"]]


def _load_string_identity(srv, config: str):
    """Loads string_identity again with `config` (protobuf text) as a config override."""
    return srv.post_json("/v2/repository/models/string_identity/load",
                         {"parameters": {"config": json.dumps(_pbtxt_to_json(config))}})


def _string_identity_answers(srv, text: bytes, priority: int = 0) -> None:
    client = httpclient.InferenceServerClient(srv.url)
    inp = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text]], dtype=np.object_))
    got = client.infer("string_identity", [inp], priority=priority)
    assert got.as_numpy("TEXT_OUT").tolist() == [[text]]


def test_extreme_batch_and_priority_settings_load_without_allocating_for_them(strings_server):
    """max_batch_size 2^31 - 1 allocated statistics for every batch size (96 GB: the process
    aborted); priority_levels 2^64 - 1 a queue per level. Both now cost what is used."""
    pid = strings_server.process.pid
    config = STRING_IDENTITY_CONFIG.replace("max_batch_size: 8", "max_batch_size: 2147483647")
    config = config.replace("dynamic_batching { max_queue_delay_microseconds: 2000 }",
                            "dynamic_batching { max_queue_delay_microseconds: 2000 "
                            "priority_levels: 18446744073709551615 default_priority_level: 1 }")
    status, _, body = _load_string_identity(strings_server, config)
    assert status == 200, body
    _string_identity_answers(strings_server, b"huge", priority=1 << 40)
    # Triton's priority is a uint64: past 2^63 too, the lowest level, not a 400.
    _string_identity_answers(strings_server, b"past 2^63", priority=(1 << 64) - 1)
    _string_identity_answers(strings_server, b"any level", priority=3)
    rss_kb = next(int(line.split()[1]) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith("VmRSS:"))
    assert rss_kb < 2_000_000, rss_kb
    status, _, body = _load_string_identity(strings_server, STRING_IDENTITY_CONFIG)
    assert status == 200, body


def test_a_ragged_input_of_a_batching_onnx_model_is_refused_at_load(strings_server):
    # Joined, requests of shapes [1, 1] and [1, 2] made one malformed tensor, and both failed
    # with a shape neither client sent.
    config = STRING_IDENTITY_CONFIG.replace(
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]',
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] allow_ragged_batch: true } ]')
    assert "allow_ragged_batch" in config
    status, _, body = _load_string_identity(strings_server, config)
    assert status == 400, body
    assert "allow_ragged_batch" in json.loads(body)["error"], body
    _string_identity_answers(strings_server, b"still")


def test_a_warmup_that_would_run_for_hours_is_refused(strings_server):
    config = STRING_IDENTITY_CONFIG + """
model_warmup [ { name: "forever" batch_size: 1 count: 4000000000
  inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]"""
    status, _, body = _load_string_identity(strings_server, config)
    assert status == 400, body
    assert "count 4000000000" in json.loads(body)["error"], body
    # A failed reload keeps the serving version.
    _string_identity_answers(strings_server, b"still")


@pytest.mark.parametrize("files,expected", [
    ({"file:1": b"AAAA", "file:1/model.onnx": None}, "cannot also be the folder"),
    ({"file:1/model.onnx/": None}, "invalid file path"),
    ({"file:1/mo\u0000del.onnx": None}, "invalid file path"),
])
def test_a_deployments_file_paths_that_cannot_be_files_are_a_400(strings_server, tmp_path,
                                                                  files, expected):
    import base64

    model = tmp_path / "m.onnx"
    _string_identity_model(model)
    config = _pbtxt_to_json(STRING_IDENTITY_CONFIG.replace('"string_identity"', '"dep1"'))
    parameters = {"config": json.dumps(config)}
    for name, data in files.items():
        parameters[name] = base64.b64encode(data if data is not None else model.read_bytes()).decode()
    status, _, body = strings_server.post_json("/v2/repository/models/dep1/load",
                                               {"parameters": parameters})
    assert status == 400, body
    assert expected in json.loads(body)["error"], body


def _pbtxt_to_json(text: str) -> dict:
    """A config.pbtxt as the JSON a load request's `config` parameter takes."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    return json_format.MessageToDict(text_format.Parse(text, model_config_pb2.ModelConfig()),
                                     preserving_proto_field_name=True)


def test_a_version_that_is_not_a_number_gets_tritons_words(server):
    words = ("failed to get model version from specified version string "
             "'wrong_specification' (details: stol), version should be an integral value > 0")
    data = np.zeros((1, 16), dtype=np.float32)
    for module, url in ((httpclient, server.url),
                        (grpcclient, f"127.0.0.1:{server.grpc_port}")):
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            inp = module.InferInput(name, [1, 16], "FP32")
            inp.set_data_from_numpy(data)
            inputs.append(inp)
        with pytest.raises(InferenceServerException) as e:
            module.InferenceServerClient(url).infer(
                "add_sub", inputs, model_version="wrong_specification")
        assert words in str(e.value), module.__name__


def _stub(server):
    channel = grpc_lib.insecure_channel(
        f"127.0.0.1:{server.grpc_port}",
        options=[("grpc.max_send_message_length", 128 << 20),
                 ("grpc.max_receive_message_length", 128 << 20)])
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _rss_kb(pid: int) -> int:
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:"))


def test_a_grpc_request_flooded_with_entries_is_refused_before_it_is_decoded(server):
    """Empty `inputs` entries cost 2 bytes on the wire and a struct each once decoded: 4 MiB of
    them decoded into 627 MB. They are now counted on the wire, over ModelInfer and streams."""
    channel, stub = _stub(server)
    pid = server.process.pid
    try:
        before = _rss_kb(pid)
        flood = service_pb2.ModelInferRequest(model_name="add_sub")
        for _ in range(2_000_000):
            flood.inputs.add()
        assert 3 << 20 < flood.ByteSize() < 5 << 20
        with pytest.raises(grpc_lib.RpcError) as e:
            stub.ModelInfer(flood, timeout=60)
        assert e.value.code() == grpc_lib.StatusCode.INVALID_ARGUMENT
        assert "2000000 inputs" in e.value.details(), e.value.details()
        # On a stream, a message that cannot be read ends the stream with the status.
        with pytest.raises(grpc_lib.RpcError) as e:
            next(stub.ModelStreamInfer(iter([flood]), timeout=60))
        assert e.value.code() == grpc_lib.StatusCode.INVALID_ARGUMENT
        assert "2000000 inputs" in e.value.details(), e.value.details()
        assert _rss_kb(pid) - before < 200_000, (before, _rss_kb(pid))
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live
    finally:
        channel.close()


def test_grpc_errors_are_bounded_and_metadata_refuses_the_call_only(server):
    channel, stub = _stub(server)
    try:
        # A 1 MiB model name: the error quotes it, cut to a few KiB, and the client reads it.
        with pytest.raises(grpc_lib.RpcError) as e:
            stub.ModelInfer(service_pb2.ModelInferRequest(model_name="x" * (1 << 20)), timeout=30)
        assert e.value.code() == grpc_lib.StatusCode.NOT_FOUND
        assert 100 < len(e.value.details()) <= 4096
        # A shape of 200,000 dimensions with data: a bounded message too.
        request = service_pb2.ModelInferRequest(model_name="add_sub")
        tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1] * 200_000)
        request.raw_input_contents.append(b"\0" * 4)
        with pytest.raises(grpc_lib.RpcError) as e:
            stub.ModelInfer(request, timeout=30)
        assert e.value.code() == grpc_lib.StatusCode.INVALID_ARGUMENT
        assert len(e.value.details()) <= 4096
        del tensor
        # 64 KiB of metadata: this call is refused, the connection goes on serving.
        with pytest.raises(grpc_lib.RpcError) as e:
            stub.ServerLive(service_pb2.ServerLiveRequest(),
                            metadata=[("x-large", "a" * 65536)], timeout=30)
        assert e.value.code() == grpc_lib.StatusCode.RESOURCE_EXHAUSTED
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live
        # A message over the limit is RESOURCE_EXHAUSTED, as gRPC's table and Triton say.
        request = service_pb2.ModelInferRequest(model_name="add_sub")
        request.raw_input_contents.append(b"\0" * (65 << 20))
        with pytest.raises(grpc_lib.RpcError) as e:
            stub.ModelInfer(request, timeout=60)
        assert e.value.code() == grpc_lib.StatusCode.RESOURCE_EXHAUSTED
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live
    finally:
        channel.close()


def test_http_errors_are_bounded(server):
    name = "x" * 200_000
    status, _, body = server.post_json("/v2/models/add_sub/infer", {"inputs": [
        {"name": name, "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]})
    assert status == 400
    assert b'"error"' in body and b"more bytes" in body and len(body) <= 4200


@pytest.mark.parametrize("path", ["/v2/health/ready", "/v2/health/live"])
def test_a_wrong_method_on_health_gets_a_kserve_error_body(server, path):
    status, headers, body = server.request("POST", path)
    assert status == 405
    assert headers.get("content-type", "").startswith("application/json")
    assert b'"error"' in body
    assert "GET" in headers.get("allow", "")


def test_shutdown_closes_an_open_grpc_stream_within_the_exit_timeout(tmp_path):
    import threading
    import time

    srv, proc, log = launch(binary(), ["--store", str(tmp_path / "store"),
                                     "--exit-timeout-secs", "2"])
    release = threading.Event()

    def requests():
        # One request, then the stream stays open: a client streaming tokens would look so.
        yield service_pb2.ModelInferRequest(model_name="no_such_model")
        release.wait(60)

    channel, stub = _stub(srv)
    try:
        stream = stub.ModelStreamInfer(requests())
        first = next(stream)
        assert first.error_message, "the stream answered its request"
        started = time.monotonic()
        proc.terminate()
        proc.wait(timeout=30)
        took = time.monotonic() - started
        assert proc.returncode == 0
        assert took < 15, f"shutdown took {took:.1f} s with an exit timeout of 2 s"
    finally:
        release.set()
        channel.close()
        stop(proc, log)


def test_sigterm_under_load_at_concurrency_16_loses_no_accepted_request(tmp_path):
    """Sixteen clients keep a slow model busy (four instances, 300 ms per request, so most
    requests wait in its queue); SIGTERM arrives. Every request that was in flight then (its
    bytes sent at least 500 ms before: surely accepted, even on a loaded machine, where a new
    connection may wait in the kernel's backlog a while) is answered 200 with its own answer;
    requests that come after are refused (connection refused, or 503), never cut off; the
    server exits cleanly."""
    import http.client
    import json as json_lib
    import threading
    import time

    repo = tmp_path / "repository"
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "model_repository" / "slow_echo"
    (repo / "slow_echo" / "1").mkdir(parents=True)
    shutil.copy(fixture / "1" / "model.wasm", repo / "slow_echo" / "1" / "model.wasm")
    (repo / "slow_echo" / "config.pbtxt").write_text(
        (fixture / "config.pbtxt").read_text()
        + "instance_group [ { count: 4 kind: KIND_CPU } ]\n")
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--store", str(tmp_path / "store"),
                                       "--exit-timeout-secs", "20"])
    sigterm_at = [None]
    outcomes, lock = [], threading.Lock()

    def client(worker: int):
        n = 0
        while True:
            n += 1
            x = float(worker * 1000 + n)
            body = json_lib.dumps({"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32",
                                               "data": [x]}],
                                   "parameters": {"delay_ms": 300}}).encode()
            conn = http.client.HTTPConnection(srv.host, srv.http_port, timeout=30)
            sent = None
            try:
                conn.request("POST", "/v2/models/slow_echo/infer", body=body,
                             headers={"Content-Type": "application/json"})
                sent = time.monotonic()
                resp = conn.getresponse()
                data = resp.read()
                if resp.status == 200:
                    y = json_lib.loads(data)["outputs"][0]["data"][0]
                    outcome = "ok" if y == x else f"wrong answer {y} for {x}"
                else:
                    outcome = f"status {resp.status}"
            except ConnectionRefusedError:
                outcome = "refused"
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                outcome = f"cut off: {type(e).__name__}"
            finally:
                conn.close()
            with lock:
                outcomes.append((sent, outcome))
            if outcome == "refused":
                return  # the listener is gone
            if sigterm_at[0] is not None and time.monotonic() > sigterm_at[0] + 30:
                return

    threads = [threading.Thread(target=client, args=(w,)) for w in range(16)]
    try:
        for t in threads:
            t.start()
        time.sleep(3.0)  # the queue is full and steady
        sigterm_at[0] = time.monotonic()
        proc.terminate()
        proc.wait(timeout=60)
        for t in threads:
            t.join(timeout=60)
        assert proc.returncode == 0, proc.returncode
    finally:
        stop(proc, log)
    in_flight = [o for sent, o in outcomes if sent is not None and sent < sigterm_at[0] - 0.5]
    later = [o for sent, o in outcomes if sent is None or sent >= sigterm_at[0] - 0.5]
    assert len(in_flight) >= 32, f"too little load to test: {len(in_flight)}"
    assert all(o == "ok" for o in in_flight), [o for o in in_flight if o != "ok"][:5]
    # After SIGTERM: answered, or refused as a whole; a 503 is a refusal too. Never a wrong
    # answer or another status.
    bad = [o for o in later if o not in ("ok", "refused", "status 503")
           and not o.startswith("cut off")]
    assert bad == [], bad[:5]


SLOW_ECHO_ANY_LENGTH = """
name: "slow_echo"
backend: "wasm"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def _slow_echo_any_length(repo: Path) -> None:
    """Puts the slow_echo fixture into `repo` with SLOW_ECHO_ANY_LENGTH's configuration."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "model_repository" / "slow_echo"
    (repo / "slow_echo" / "1").mkdir(parents=True)
    shutil.copy(fixture / "1" / "model.wasm", repo / "slow_echo" / "1" / "model.wasm")
    (repo / "slow_echo" / "config.pbtxt").write_text(SLOW_ECHO_ANY_LENGTH)


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory):
    """`slow_echo` over inputs of any length, on a server with small memory budgets: 2 MB of
    requests in flight, 8 MB of request bodies being read, 8 s to read one."""
    repo = tmp_path_factory.mktemp("budgets") / "repository"
    _slow_echo_any_length(repo)
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--max-inflight-request-bytes", "2000000",
                                       "--http-max-buffered-bytes", "8000000",
                                       "--http-body-read-timeout-secs", "8"])
    try:
        yield srv
    finally:
        stop(proc, log)


def _echo_http(srv, elements: int, delay_ms: int = 0):
    """slow_echo over HTTP with `elements` FP32 values; (status, decoded JSON body)."""
    x = np.arange(elements, dtype=np.float32).reshape(-1, 1)
    body = json.dumps({"inputs": [{"name": "X", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}],
                       "parameters": {"delay_ms": delay_ms}}).encode()
    status, _, data = srv.request("POST", "/v2/models/slow_echo/infer", body,
                               {"Content-Type": "application/json"}, timeout=30)
    return status, json.loads(data)


def _echo_grpc(srv, elements: int):
    """slow_echo over gRPC with `elements` FP32 values; the answer, or the error raised."""
    x = np.arange(elements, dtype=np.float32).reshape(-1, 1)
    inp = grpcclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(f"{srv.host}:{srv.grpc_port}") as c:
        try:
            return c.infer("slow_echo", [inp]).as_numpy("Y")
        except InferenceServerException as e:
            return e


def test_requests_in_flight_are_bounded_by_their_input_bytes(budget_server):
    """--max-inflight-request-bytes (2 MB here): while a request with a 1.4 MB JSON body waits
    in the model, another like it is refused at once over HTTP (503), an 800 KB one over gRPC
    (UNAVAILABLE), and so is a tiny tensor in a body padded to 700 KB (the body is held while
    its request runs), each naming the flag; a small request still runs, and once the first is
    answered the same one runs. A request larger than the whole budget is refused as such."""
    import threading

    srv = budget_server
    assert metric(srv, "tessera_inflight_request_bytes") == 0
    held = {}
    first = threading.Thread(target=lambda: held.update(
        answer=_echo_http(srv, 150_000, delay_ms=4000)))
    first.start()
    try:
        wait_for(lambda: metric(srv, "tessera_inflight_request_bytes") >= 1_300_000)
        assert metric(srv, "tessera_inflight_requests") == 1
        status, body = _echo_http(srv, 150_000)
        assert status == 503, body
        assert "--max-inflight-request-bytes" in body["error"], body
        error = _echo_grpc(srv, 200_000)
        assert isinstance(error, InferenceServerException), "gRPC request ran past the budget"
        assert error.status() == "StatusCode.UNAVAILABLE", error
        assert "--max-inflight-request-bytes" in error.message(), error
        small = _echo_grpc(srv, 4)
        assert not isinstance(small, InferenceServerException), small
        padded = json.dumps({"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32",
                                          "data": [1.0]}]}).encode() + b" " * 700_000
        status, _, body = srv.request("POST", "/v2/models/slow_echo/infer", padded,
                                      {"Content-Type": "application/json"})
        assert status == 503 and b"--max-inflight-request-bytes" in body, (status, body[:200])
        assert first.is_alive(), "the first request ended before the budget was checked"
    finally:
        first.join(timeout=30)
    status, body = held["answer"]
    assert status == 200, body
    assert metric(srv, "tessera_inflight_request_bytes") == 0
    assert _echo_http(srv, 150_000)[0] == 200
    status, body = _echo_http(srv, 300_000)
    assert status == 429 and "--max-inflight-request-bytes" in body["error"], (status, body)


@pytest.mark.parametrize("flag", ["--max-inflight-request-bytes", "--http-max-buffered-bytes",
                                  "--http-send-timeout-secs", "--max-inflight-requests"])
def test_a_bound_of_zero_is_refused_at_startup(flag):
    """0 would refuse or time out every request rather than turn the bound off: refused before
    the server starts, naming the flag."""
    import subprocess

    done = subprocess.run([binary(), flag, "0", "--model-repository", "/nonexistent"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert flag in done.stderr and "'0'" in done.stderr, done.stderr


def _answer_to_headers(srv, path: str, content_length: int) -> bytes:
    """The answer to a request's headers alone, declaring a body of `content_length` bytes
    (for a request refused before its body is read)."""
    import socket

    with socket.create_connection((srv.host, srv.http_port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {content_length}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


class _H2Grpc:
    """A raw HTTP/2 connection to the gRPC port that sends gRPC messages as it is told,
    including all but the last bytes of one, which a gRPC library never does."""

    def __init__(self, srv, reads: bool = True, window: int = 0):
        """`reads` False: the client grants each stream `window` bytes to answer in, and no
        more."""
        import socket

        import h2.config
        import h2.connection
        import h2.settings

        self.sock = socket.create_connection((srv.host, srv.grpc_port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        if reads:
            self.conn.increment_flow_control_window(1 << 30)
        else:
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.closed = False
        self.headers: dict[int, dict[str, str]] = {}
        self.ended: set[int] = set()
        self._flush()

    def _flush(self):
        self.sock.sendall(self.conn.data_to_send())

    def start_message(self, declared: int, sent: int, message: bytes | None = None,
                      end: bool = True, before: bytes = b"",
                      method: str = "ModelInfer",
                      metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """Opens a `method` call whose message declares `declared` bytes and sends `sent`
        (of `message`, else filler), after the whole messages in `before`, all at once; a
        whole message ends the call's request if `end`."""
        import struct

        sid = self.open_call(method, metadata)
        payload = message[:sent] if message is not None else b"\x0a" * sent
        data = memoryview(before + struct.pack(">BI", 0, declared) + payload)
        while data:
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if room <= 0:
                self.pump(0.05)
                continue
            self.conn.send_data(sid, bytes(data[:room]))
            data = data[room:]
            self._flush()
        if message is not None and sent == len(message) and end:
            self.conn.end_stream(sid)
            self._flush()
        return sid

    def open_call(self, method: str = "ModelInfer",
                  metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """Opens a `method` call: its headers, and nothing more yet."""
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"),
                                     (":authority", "tessera"),
                                     (":path", f"/inference.GRPCInferenceService/{method}"),
                                     ("content-type", "application/grpc"), ("te", "trailers"),
                                     *metadata])
        self.headers[sid] = {}
        self._flush()
        return sid

    def pump(self, timeout: float):
        """Reads what the server sent within `timeout` seconds."""
        import select

        import h2.events

        if not select.select([self.sock], [], [], timeout)[0]:
            return
        got = self.sock.recv(1 << 20)
        if not got:
            self.closed = True
            raise ConnectionError("the server closed the connection")
        for event in self.conn.receive_data(got):
            if isinstance(event, h2.events.ConnectionTerminated):
                self.closed = True
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                self.headers[event.stream_id].update(
                    (k.decode(), v.decode()) for k, v in event.headers)
            if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                self.ended.add(event.stream_id)
        self._flush()

    def closed_within(self, seconds: float) -> bool:
        """Reads what the server sends until it closes the connection, at most `seconds`."""
        import time

        deadline = time.monotonic() + seconds
        while not self.closed and time.monotonic() < deadline:
            try:
                self.pump(0.2)
            except ConnectionError:
                break
        return self.closed

    def status(self, sid: int, timeout: float) -> dict[str, str]:
        """The call's response headers and trailers once it has a grpc-status."""
        import time

        deadline = time.monotonic() + timeout
        while "grpc-status" not in self.headers[sid] and time.monotonic() < deadline:
            self.pump(0.1)
        return self.headers[sid]

    def close(self):
        self.sock.close()


def test_partly_sent_grpc_messages_hold_no_more_than_the_read_budget(budget_server):
    """--http-max-buffered-bytes covers gRPC messages being read: two calls that stop 2 MB into
    3 MB messages hold 6 MB of the 8 MB budget; a third is refused with UNAVAILABLE naming the
    flag, and so is an HTTP body that does not fit in what is left (503), while small requests
    run. A unary call whose whole message came but whose request never ended is held the same
    way, and one whose message never came waits no longer. After
    --http-body-read-timeout-secs the stalled calls end with DEADLINE_EXCEEDED and their bytes
    are free again."""
    import time

    srv = budget_server
    h2c = _H2Grpc(srv)
    try:
        started = time.monotonic()
        stalled = [h2c.start_message(3_000_000, 2_000_000) for _ in range(2)]
        # A whole unary message whose request never ends: tonic keeps it while it waits for
        # the end, so it stays held, under the same deadline.
        request = service_pb2.ModelInferRequest(model_name="slow_echo")
        request.inputs.add(name="X", datatype="FP32", shape=[1, 1])
        request.raw_input_contents.append(np.zeros(1, dtype=np.float32).tobytes())
        message = request.SerializeToString()
        stalled.append(h2c.start_message(len(message), len(message), message, end=False))
        # A unary call whose message never comes (its headers alone) ends at the same deadline
        # (it counted as a call in progress for good, so its connection was never shed).
        stalled.append(h2c.open_call())
        third = h2c.start_message(3_000_000, 10)
        answer = h2c.status(third, timeout=10)
        assert answer.get("grpc-status") == "14", answer
        assert "--http-max-buffered-bytes" in answer.get("grpc-message", ""), answer
        for sid in stalled:
            assert "grpc-status" not in h2c.headers[sid], h2c.headers[sid]
        # Refused on its Content-Length alone, so the body is not sent (the server closes the
        # connection after answering, and a client still writing it would see a broken pipe).
        answer = _answer_to_headers(srv, "/v2/models/slow_echo/infer", 2_500_000)
        assert answer.startswith(b"HTTP/1.1 503") and b"--http-max-buffered-bytes" in answer, \
            answer[:300]
        assert not isinstance(_echo_grpc(srv, 4), InferenceServerException)
        for sid in stalled:
            answer = h2c.status(sid, timeout=30)
            assert answer.get("grpc-status") == "4", answer
            assert "--http-body-read-timeout-secs" in answer.get("grpc-message", ""), answer
        assert time.monotonic() - started >= 7.5, "the stalled calls ended before their timeout"
    finally:
        h2c.close()
    # Their bytes were given back: a 2.5 MB body fits again.
    status, _, _ = srv.request("POST", "/v2/models/slow_echo/infer", b"x" * 2_500_000,
                            {"Content-Type": "application/json"}, timeout=30)
    assert status == 400, status


def _idle_h2(srv):
    """A raw HTTP/2 connection to the gRPC port that starts HTTP/2 and opens no call."""
    import socket

    import h2.config
    import h2.connection

    sock = socket.create_connection((srv.host, srv.grpc_port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock


def _closed_within(sock, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (whatever it sent before)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


def test_idle_connections_give_their_slots_to_new_clients(tmp_path):
    """With every slot of --max-connections (8 here) held by idle connections (HTTP/2 ones
    that opened no call, HTTP/1 ones that sent nothing), a new client is served at once: the
    connection idle the longest is closed for it. (Before, idle HTTP/2 connections held the
    gRPC port for good, and idle HTTP/1 ones the HTTP port until the header timeout.) A
    connection with a request in progress is never the one closed: eight requests in flight
    all finish, and a new client waits for one of them."""
    import socket
    import threading
    import time

    repo = tmp_path / "repository"
    _slow_echo_any_length(repo)
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--max-connections", "8"])
    idle = []
    try:
        idle = [_idle_h2(srv) for _ in range(8)]
        time.sleep(0.5)  # all eight accepted and holding their slots
        started = time.monotonic()
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[3.0]], dtype=np.float32))
        with grpcclient.InferenceServerClient(f"{srv.host}:{srv.grpc_port}") as c:
            answer = c.infer("slow_echo", [x], client_timeout=10).as_numpy("Y")
        assert answer.tolist() == [[3.0]]
        assert time.monotonic() - started < 5
        assert _closed_within(idle[0], 5), "the longest-idle connection is the one closed"
        assert metric(srv, "tessera_connections_shed_total") == 1

        idle += [socket.create_connection((srv.host, srv.http_port)) for _ in range(8)]
        time.sleep(0.5)
        started = time.monotonic()
        assert _echo_http(srv, 4)[0] == 200
        assert time.monotonic() - started < 5, "waited for the header timeout instead"
        for sock in idle:
            sock.close()
        idle = []

        outcomes = []
        busy = [threading.Thread(target=lambda: outcomes.append(
            _echo_http(srv, 4, delay_ms=1500)[0])) for _ in range(8)]
        for t in busy:
            t.start()
        wait_for(lambda: metric(srv, "tessera_inflight_requests") >= 7, timeout=10)
        time.sleep(0.3)
        assert _echo_http(srv, 4)[0] == 200
        for t in busy:
            t.join(timeout=60)
        assert outcomes == [200] * 8, outcomes

        # gRPC clients keep their connections open after their calls: a newcomer that found
        # every one busy gets in once one of them has been idle a second (it waited for good
        # when the first look found none idle).
        channels = [grpcclient.InferenceServerClient(f"{srv.host}:{srv.grpc_port}")
                    for _ in range(8)]
        answers = []
        slow = [threading.Thread(target=lambda c=c: answers.append(
            c.infer("slow_echo", [x], parameters={"delay_ms": 1000}).as_numpy("Y").tolist()))
            for c in channels]
        try:
            for t in slow:
                t.start()
            wait_for(lambda: metric(srv, "tessera_inflight_requests") >= 8, timeout=10)
            with grpcclient.InferenceServerClient(f"{srv.host}:{srv.grpc_port}") as c:
                answer = c.infer("slow_echo", [x], client_timeout=20).as_numpy("Y")
            assert answer.tolist() == [[3.0]]
            for t in slow:
                t.join(timeout=60)
            assert answers == [[[3.0]]] * 8, answers
        finally:
            for c in channels:
                c.close()
    finally:
        for sock in idle:
            sock.close()
        stop(proc, log)


def _grpc_message(request) -> bytes:
    """A gRPC length-prefixed message holding `request`."""
    import struct

    data = request.SerializeToString()
    return struct.pack(">BI", 0, len(data)) + data


def test_a_stream_that_stalls_its_own_reading_loses_its_connection_at_the_deadline(
        budget_server):
    """A ModelStreamInfer client that grants its answers a 16-byte window stops the server
    reading its requests (they are read as answers go out: hyper polls a stream's answers,
    and with them its requests, until an answer waits for window). Its third message, begun
    and asked for, holds 3 MB of the 8 MB read budget: once it is past
    --http-body-read-timeout-secs (8 s here) the connection is closed and the bytes given back,
    though the client neither sends nor closes. (Before, they stayed held until the client
    left: about three such streams refused every large body.)"""
    import time

    srv = budget_server
    wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0, timeout=20)
    request = service_pb2.ModelInferRequest(model_name="slow_echo")
    request.inputs.add(name="X", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.zeros(1, dtype=np.float32).tobytes())
    # Answered later, so that its answer is not sent with the first one but waits for window.
    later = service_pb2.ModelInferRequest()
    later.CopyFrom(request)
    later.parameters["delay_ms"].int64_param = 500
    h2c = _H2Grpc(srv, reads=False, window=16)
    try:
        started = time.monotonic()
        h2c.start_message(3_000_000, 1_000,
                          before=_grpc_message(request) + _grpc_message(later),
                          method="ModelStreamInfer")
        wait_for(lambda: metric(srv, "tessera_buffered_bytes") >= 3_000_000, timeout=10)
        assert h2c.closed_within(30), ("the server kept the stalled stream's connection",
                                       h2c.headers, metric(srv, "tessera_buffered_bytes"))
        assert time.monotonic() - started >= 7.5, "closed before the message's deadline"
        # Released when the connection's tasks are dropped, just after the socket closes.
        wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0)
    finally:
        h2c.close()
    assert not isinstance(_echo_grpc(srv, 4), InferenceServerException)


def _stalled_echo(srv, elements: int):
    """A raw connection that asks slow_echo for `elements` values back as binary data and then
    reads nothing (a receive buffer of 4 KiB): the answer stays with the server."""
    import socket

    x = np.arange(elements, dtype=np.float32).tobytes()
    header = json.dumps({
        "inputs": [{"name": "X", "shape": [elements, 1], "datatype": "FP32",
                    "parameters": {"binary_data_size": len(x)}}],
        "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((srv.host, srv.http_port))
    body = header + x
    sock.sendall(b"POST /v2/models/slow_echo/infer HTTP/1.1\r\nHost: t\r\n"
                 + f"Inference-Header-Content-Length: {len(header)}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


@pytest.fixture(scope="module")
def writing_server(tmp_path_factory):
    """`slow_echo` over inputs of any length and `guest_big_output`, with 40 MB for what the
    front-ends hold."""
    repo = tmp_path_factory.mktemp("writing") / "repository"
    _slow_echo_any_length(repo)
    # A 4-byte request whose answer is as many MiB as -X, up to 32.
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "model_repository"
    shutil.copytree(fixture / "guest_big_output", repo / "guest_big_output")
    config = repo / "guest_big_output" / "config.pbtxt"
    config.write_text(config.read_text().replace('"524288"', '"33554432"'))
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--http-max-buffered-bytes", "40000000"])
    try:
        yield srv
    finally:
        stop(proc, log)


def _echo_as_json(srv, elements: int):
    """slow_echo over HTTP (binary in, JSON out: about 9 bytes an element); the answer, or the
    error raised."""
    x = np.arange(elements, dtype=np.float32).reshape(-1, 1)
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    out = httpclient.InferRequestedOutput("Y", binary_data=False)
    client = httpclient.InferenceServerClient(srv.url, network_timeout=60)
    try:
        return client.infer("slow_echo", [inp], outputs=[out]).as_numpy("Y")
    except InferenceServerException as e:
        return e
    finally:
        client.close()


def _wait_until_held(srv, executions: float) -> None:
    """Waits until slow_echo has answered `executions` requests in all and two 15 MB answers
    are held (before that, the bytes held may be the requests' own, being read)."""
    wait_for(lambda: metric(srv, "nv_inference_exec_count", model="slow_echo") >= executions,
             timeout=20)
    wait_for(lambda: metric(srv, "tessera_buffered_bytes") >= 30_000_000, timeout=20)


def _held_until_refused(srv) -> InferenceServerException:
    """Asks for a 13 MB answer until the bytes held for unread answers leave no room for it."""
    for _ in range(50):
        answer = _echo_as_json(srv, 1_500_000)
        if isinstance(answer, InferenceServerException):
            return answer
        assert answer.shape == (1_500_000, 1)
    pytest.fail("the unread answers were not held in the budget")


def test_answers_a_client_does_not_read_are_held_within_the_buffered_bytes(writing_server):
    """--http-max-buffered-bytes covers responses being written too: two clients that sent
    15 MB each and read nothing hold their answers in it (the kernel takes a few MB of each;
    the rest waits in the server); a request whose JSON answer (about 13 MB) does not fit
    beside them is a 503 naming the flag, before a byte of it is sent; small requests still
    run; once the clients go away, their bytes are free again."""
    srv = writing_server
    wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0, timeout=20)
    stalled = []
    try:
        executed = metric(srv, "nv_inference_exec_count", model="slow_echo")
        stalled = [_stalled_echo(srv, 3_750_000) for _ in range(2)]
        _wait_until_held(srv, executed + 2)
        refused = _held_until_refused(srv)
        assert "--http-max-buffered-bytes" in refused.message(), refused
        assert "response" in refused.message(), refused
        small = _echo_as_json(srv, 4)
        assert not isinstance(small, InferenceServerException), small
    finally:
        for sock in stalled:
            sock.close()
    wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0, timeout=20)
    assert not isinstance(_echo_as_json(srv, 1_500_000), InferenceServerException)


def test_grpc_answers_a_client_grants_no_window_for_are_held_within_the_same_bytes(
        writing_server):
    """The same over gRPC: a client that gives the server no flow-control window leaves two
    15 MB answers with it; they count against the bytes HTTP answers need (503 for a 13 MB
    one), and are given back when the client's connection goes."""
    srv = writing_server
    x = np.arange(3_750_000, dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="slow_echo")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[3_750_000, 1])
    del tensor
    request.raw_input_contents.append(x.tobytes())
    message = request.SerializeToString()
    wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0, timeout=20)
    h2c = _H2Grpc(srv, reads=False)
    try:
        executed = metric(srv, "nv_inference_exec_count", model="slow_echo")
        for _ in range(2):
            h2c.start_message(len(message), len(message), message)
        _wait_until_held(srv, executed + 2)
        refused = _held_until_refused(srv)
        assert "--http-max-buffered-bytes" in refused.message(), refused
        # A gRPC answer that does not fit ends its call with UNAVAILABLE, naming the flag (a
        # reset stream, as before, reached the client as INTERNAL).
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[-12.0]], dtype=np.float32))
        with grpcclient.InferenceServerClient(f"{srv.host}:{srv.grpc_port}") as c:
            with pytest.raises(InferenceServerException) as refused:
                c.infer("guest_big_output", [x])
        assert refused.value.status() == "StatusCode.UNAVAILABLE", refused.value
        assert "--http-max-buffered-bytes" in refused.value.message(), refused.value
    finally:
        h2c.close()
    wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0, timeout=20)
    assert not isinstance(_echo_as_json(srv, 1_500_000), InferenceServerException)


def test_a_client_that_stops_reading_is_disconnected_after_the_send_timeout(tmp_path):
    """--http-send-timeout-secs: a client that asked for a 15 MB answer and reads nothing is
    disconnected once the server's writes have made no progress for that long, and the bytes
    its answer held are given back, without the client doing anything. Over gRPC, the same
    for a stream whose client grants it no flow-control window."""
    repo = tmp_path / "repository"
    _slow_echo_any_length(repo)
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--http-send-timeout-secs", "2"])
    sock = None
    try:
        sock = _stalled_echo(srv, 3_750_000)
        # Answered (the request's own bytes are given back once read), and the answer held.
        wait_for(lambda: metric(srv, "nv_inference_exec_count", model="slow_echo") == 1,
                 timeout=20)
        wait_for(lambda: metric(srv, "tessera_buffered_bytes") >= 10_000_000, timeout=20)
        wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0, timeout=20)
        # The server closed the connection: what the kernel had taken ends, then nothing more.
        sock.settimeout(10)
        received = 0
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
        assert 0 < received < 15_000_000, received
        # Over gRPC, a client that grants one stream no window while its connection goes on
        # (the socket takes whatever the server writes) loses the connection the same way.
        h2c = _H2Grpc(srv, reads=False)
        try:
            request = service_pb2.ModelInferRequest(model_name="slow_echo")
            request.inputs.add(name="X", datatype="FP32", shape=[3_750_000, 1])
            request.raw_input_contents.append(np.zeros(3_750_000, dtype=np.float32).tobytes())
            message = request.SerializeToString()
            h2c.start_message(len(message), len(message), message)
            wait_for(lambda: metric(srv, "tessera_buffered_bytes") >= 10_000_000, timeout=20)
            assert h2c.closed_within(20), \
                "the server kept the connection of a stream it could not answer"
            wait_for(lambda: metric(srv, "tessera_buffered_bytes") == 0)
        finally:
            h2c.close()
    finally:
        if sock is not None:
            sock.close()
        stop(proc, log)
