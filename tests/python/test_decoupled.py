"""Decoupled models (0..N responses per request) against the real `tritonclient.grpc` and the
generate extension over HTTP: Triton's repeat_int32 contract, backpressure to a slow reader,
cancellation, in-flight batching on one instance, and what a broken handler's stream says.
"""
from __future__ import annotations

import http.client
import json
import queue
import shutil
import threading
import time

import grpc as grpc_lib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import REPO_ROOT, binary, launch, metric, stop, wait_for


def repeat_inputs(values, delays, wait):
    inputs = [grpcclient.InferInput("IN", [len(values)], "INT32"),
              grpcclient.InferInput("DELAY", [len(delays)], "UINT32"),
              grpcclient.InferInput("WAIT", [1], "UINT32")]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait], dtype=np.uint32))
    return inputs


def final_flag(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


class Stream:
    """A tritonclient gRPC stream whose callback queues (result, error) pairs."""

    def __init__(self, server):
        self.client = grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def get(self):
        return self.answers.get(timeout=30)

    def close(self):
        self.client.stop_stream()
        self.client.close()


def test_repeat_int32_answers_as_tritons_custom_repeat_example(server):
    """The flow of Triton's simple_grpc_custom_repeat.py: one request, one response per value,
    OUT only when asked for OUT; the flags-only final response only on request."""
    stream = Stream(server)
    try:
        values = list(range(100, 110))
        stream.client.async_stream_infer("repeat_int32", repeat_inputs(values, [5] * 10, 5),
                                         outputs=[grpcclient.InferRequestedOutput("OUT")])
        got = [stream.get() for _ in values]
        for i, (result, error) in enumerate(got):
            assert error is None, error
            assert result.as_numpy("OUT").tolist() == [values[i]]
            assert result.as_numpy("IDX") is None, "IDX was not asked for"
            assert final_flag(result) is False
        # Without triton_enable_empty_final_response the flags-only final is not sent.
        with pytest.raises(queue.Empty):
            stream.answers.get(timeout=0.3)

        stream.client.async_stream_infer("repeat_int32", repeat_inputs([7, 8], [1, 1], 1),
                                         request_id="with-final",
                                         enable_empty_final_response=True)
        got = [stream.get() for _ in range(3)]
        assert [r.as_numpy("IDX").tolist() for r, _ in got[:2]] == [[0], [1]]
        last, error = got[2]
        assert error is None and final_flag(last) is True
        assert last.get_response().id == "with-final"
        assert last.as_numpy("OUT") is None, "the final response carries no outputs"
    finally:
        stream.close()


def test_one_instance_serves_many_streams_at_once(server):
    """repeat_int32 has one instance: a short stream started while a long one runs finishes
    first (new requests join the running ones), and both are complete and in order."""
    stream = Stream(server)
    try:
        # 20 responses 150 ms apart: the short one starts once the long one has begun, with
        # seconds to spare on a loaded machine.
        stream.client.async_stream_infer("repeat_int32", repeat_inputs(list(range(20)), [150] * 20, 0),
                                         request_id="long", enable_empty_final_response=True)
        order = []
        per_request = {"long": [], "short": []}
        result, error = stream.get()
        assert error is None, error
        assert result.get_response().id == "long" and not final_flag(result)
        per_request["long"].append(int(result.as_numpy("OUT")[0]))
        stream.client.async_stream_infer("repeat_int32", repeat_inputs([1, 2], [1, 1], 0),
                                         request_id="short", enable_empty_final_response=True)
        while len(order) < 2:
            result, error = stream.get()
            assert error is None, error
            response = result.get_response()
            if final_flag(result):
                order.append(response.id)
            else:
                per_request[response.id].append(int(result.as_numpy("OUT")[0]))
        assert order == ["short", "long"]
        assert per_request == {"long": list(range(20)), "short": [1, 2]}
    finally:
        stream.close()


def test_a_decoupled_model_refuses_one_response_calls(server, client):
    inputs = [httpclient.InferInput("IN", [1], "INT32"), httpclient.InferInput("DELAY", [1], "UINT32"),
              httpclient.InferInput("WAIT", [1], "UINT32")]
    for tensor, value in zip(inputs, ([1], [0], [0])):
        tensor.set_data_from_numpy(np.array(value, dtype=np.int32 if tensor.name() == "IN" else np.uint32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("repeat_int32", inputs)
    assert e.value.status() == "400"
    assert "decoupled" in e.value.message()
    grpc = grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
    try:
        with pytest.raises(InferenceServerException) as e:
            grpc.infer("repeat_int32", repeat_inputs([1], [0], 0))
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "decoupled" in e.value.message()
    finally:
        grpc.close()


def _post(server, path, body, timeout=30):
    conn = http.client.HTTPConnection(server.host, server.http_port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def sse_events(text: str):
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


def test_generate_and_generate_stream_map_keys_as_triton_does(server):
    conn, r = _post(server, "/v2/models/repeat_int32/generate_stream",
                    {"IN": [5, 6, 7], "DELAY": [1, 1, 1], "WAIT": 0, "id": "g1", "temperature": 0.5})
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    events = sse_events(r.read().decode())
    conn.close()
    assert [(e["OUT"], e["IDX"]) for e in events] == [(5, 0), (6, 1), (7, 2)]
    assert all(e["id"] == "g1" and e["model_name"] == "repeat_int32" for e in events)

    conn, r = _post(server, "/v2/models/repeat_int32/versions/1/generate",
                    {"IN": 9, "DELAY": 0, "parameters": {"WAIT": 0}})
    answer = json.loads(r.read())
    conn.close()
    assert (r.status, answer["OUT"], answer["model_version"]) == (200, 9, "1")

    conn, r = _post(server, "/v2/models/repeat_int32/generate", {"IN": [1, 2], "DELAY": [0, 0], "WAIT": 0})
    assert r.status == 400 and "generate_stream" in json.loads(r.read())["error"]
    conn.close()
    # A model that is not decoupled answers both with its one response.
    ones = [1.0] * 16
    conn, r = _post(server, "/v2/models/add_sub_wasm/generate_stream", {"INPUT0": ones, "INPUT1": ones})
    events = sse_events(r.read().decode())
    conn.close()
    assert len(events) == 1 and events[0]["OUTPUT0"] == [2.0] * 16
    conn, r = _post(server, "/v2/models/repeat_int32/generate", {"IN": [1], "DELAY": [1, 2], "WAIT": 0})
    assert r.status == 400 and "one delay per value" in json.loads(r.read())["error"]
    conn.close()


@pytest.fixture(scope="module")
def probe_server(request):
    failed_before = request.session.testsfailed
    srv, proc, log = launch(binary(), ["--model-repository", "tests/fixtures/model_repository",
                                       "--functions", "tests/fixtures/functions"])
    yield srv, proc
    stop(proc, log, keep=request.session.testsfailed > failed_before)


def _stub(srv):
    channel = grpc_lib.insecure_channel(
        f"127.0.0.1:{srv.grpc_port}", options=[("grpc.max_receive_message_length", 64 << 20)])
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def probe_request(count: int, size: int, mode: int = 0, request_id: str = ""):
    request = service_pb2.ModelInferRequest(model_name="stream_probe", id=request_id)
    for name, value in (("COUNT", count), ("BYTES", size), ("MODE", mode)):
        tensor = request.inputs.add(name=name, datatype="UINT32", shape=[1])
        tensor.contents.uint_contents.append(value)
    return request


def rss_bytes(proc) -> int:
    with open(f"/proc/{proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_slow_reader_slows_the_sender_and_memory_stays_bounded(probe_server):
    """10,000 responses of 16 KiB (160 MiB in all) to a reader that stops for a while: the
    handler waits at its sends, so the server holds a few buffered responses, not the stream."""
    srv, proc = probe_server
    channel, stub = _stub(srv)
    release = threading.Event()

    def requests():
        request = probe_request(10_000, 16 << 10)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        yield request
        release.wait(60)

    try:
        answers = stub.ModelStreamInfer(requests())
        first = next(answers)
        assert first.error_message == "", first.error_message
        before = rss_bytes(proc)
        time.sleep(2)  # the reader stalls; an unbounded server would buffer the rest meanwhile
        grown = rss_bytes(proc) - before
        assert grown < 48 << 20, f"the server grew {grown >> 20} MiB while the reader stalled"
        count, last_index = 1, 0
        for answer in answers:
            assert answer.error_message == "", answer.error_message
            response = answer.infer_response
            if response.parameters["triton_final_response"].bool_param:
                assert not response.raw_output_contents, "the final response has no outputs"
                break
            count += 1
            last_index = int(np.frombuffer(response.raw_output_contents[1], np.uint32)[0])
        assert (count, last_index) == (10_000, 9_999)
        assert metric(srv, "tessera_inference_streamed_responses", "stream_probe") >= 10_000
        assert metric(srv, "tessera_inference_first_response_count", "stream_probe") >= 1
    finally:
        release.set()
        channel.close()


def test_cancelled_streams_stop_their_handler_and_leave_nothing_behind(probe_server):
    """1,000 streams cancelled after their first response, on a model with one instance: each
    handler's next send fails, so the instance is free for the next stream at once (were it not,
    the second stream would wait forever behind a handler sending to nobody)."""
    srv, proc = probe_server
    channel, stub = _stub(srv)
    instances = metric(srv, "tessera_wasm_live_instances")
    cancelled = metric(srv, "tessera_inference_cancelled_streams", "stream_probe")
    before = rss_bytes(proc)
    try:
        for i in range(1000):
            # mode 0 sends from execute, mode 1 from resume: both must notice the cancellation.
            request = probe_request(1_000_000, 1024, mode=i % 2)
            call = stub.ModelStreamInfer(iter([request]), timeout=30)
            first = next(call)
            assert first.error_message == "", first.error_message
            call.cancel()
        grown = rss_bytes(proc) - before
        assert grown < 64 << 20, f"the server grew {grown >> 20} MiB over 1,000 cancelled streams"
        assert metric(srv, "tessera_wasm_live_instances") == instances
        # The server sees the last cancellations a moment after the client sends them.
        wait_for(lambda: metric(srv, "tessera_inference_cancelled_streams", "stream_probe")
                 >= cancelled + 1000)
        assert metric(srv, "tessera_inference_cancelled_streams", "stream_probe") == cancelled + 1000
        # And it keeps serving: a whole stream goes through.
        answers = list(stub.ModelStreamInfer(iter([probe_request(5, 8)]), timeout=30))
        assert len(answers) == 5 and all(a.error_message == "" for a in answers)
    finally:
        channel.close()


def test_an_sse_client_that_disconnects_cancels_its_request(probe_server):
    srv, _ = probe_server
    body = {"COUNT": 1_000_000, "BYTES": 64}
    for _ in range(20):
        conn, r = _post(srv, "/v2/models/stream_probe/generate_stream", body)
        assert r.status == 200
        assert r.readline().startswith(b"data: ")
        conn.close()  # the client goes away mid-stream
    conn, r = _post(srv, "/v2/models/stream_probe/generate_stream", {"COUNT": 3, "BYTES": 1})
    assert [e["IDX"] for e in sse_events(r.read().decode())] == [0, 1, 2]
    conn.close()


def test_a_broken_handler_ends_its_stream_with_an_error_and_the_model_keeps_serving(probe_server):
    srv, _ = probe_server
    channel, stub = _stub(srv)
    try:
        dropped = list(stub.ModelStreamInfer(iter([probe_request(3, 8, mode=2)]), timeout=30))
        assert len(dropped) == 1
        assert "dropped the response sender" in dropped[0].error_message
        trapped = list(stub.ModelStreamInfer(iter([probe_request(3, 8, mode=3)]), timeout=30))
        assert trapped[0].error_message == ""  # the response sent before the trap
        assert "trapped" in trapped[-1].error_message or "panicked" in trapped[-1].error_message
        answers = list(stub.ModelStreamInfer(iter([probe_request(4, 8)]), timeout=30))
        assert len(answers) == 4 and all(a.error_message == "" for a in answers)
    finally:
        channel.close()


def relay_request(count: int, size: int, mode: int = 0):
    request = probe_request(count, size, mode)
    request.model_name = "stream_relay"
    return request


def test_a_handler_reads_a_decoupled_models_stream_and_forwards_it(probe_server):
    """stream_relay calls stream_probe with infer_stream (through stream_probe's queue) and
    forwards each response as it comes; cancelling the outer stream cancels the inner call."""
    srv, _ = probe_server
    channel, stub = _stub(srv)
    try:
        answers = list(stub.ModelStreamInfer(iter([relay_request(50, 32)]), timeout=30))
        assert all(a.error_message == "" for a in answers), answers[0].error_message
        indices = [int(np.frombuffer(a.infer_response.raw_output_contents[1], np.uint32)[0])
                   for a in answers]
        assert indices == list(range(50))
        assert answers[0].infer_response.model_name == "stream_relay"
        # Both models have one instance: were a cancelled relay (or the probe it calls) left
        # sending, the next call would wait behind it.
        for i in range(100):
            call = stub.ModelStreamInfer(iter([relay_request(1_000_000, 256, mode=i % 2)]),
                                         timeout=30)
            assert next(call).error_message == ""
            call.cancel()
        answers = list(stub.ModelStreamInfer(iter([relay_request(3, 8)]), timeout=30))
        assert len(answers) == 3 and all(a.error_message == "" for a in answers)
        # A one-response call to a decoupled model is refused, in the handler too.
        refused = list(stub.ModelStreamInfer(iter([relay_request(1, 1, mode=9)]), timeout=30))
        assert "decoupled" in refused[0].error_message
        # Open calls are bounded per instance: each is a request in the callee's queue that
        # no admission limit counts (one handler queued 360,000 of them before).
        refused = list(stub.ModelStreamInfer(iter([relay_request(1, 1, mode=8)]), timeout=60))
        message = refused[0].error_message
        assert "opened 1024:" in message and "1024 open infer-stream calls" in message, message
        answers = list(stub.ModelStreamInfer(iter([relay_request(3, 8)]), timeout=30))
        assert len(answers) == 3 and all(a.error_message == "" for a in answers)
    finally:
        channel.close()


def test_a_function_streams_a_decoupled_models_responses_into_its_body(probe_server):
    """function_probe's /stream reads stream_probe with infer_stream and writes each response
    into its HTTP body as it comes; a client that leaves mid-body cancels the whole chain."""
    srv, _ = probe_server
    conn = http.client.HTTPConnection(srv.host, srv.http_port, timeout=30)
    conn.request("GET", "/v1/functions/function_probe/stream?5")
    r = conn.getresponse()
    assert (r.status, r.read()) == (200, b"0\n1\n2\n3\n4\n")
    conn.close()
    for _ in range(10):
        conn = http.client.HTTPConnection(srv.host, srv.http_port, timeout=30)
        conn.request("GET", "/v1/functions/function_probe/stream?1000000")
        r = conn.getresponse()
        assert r.status == 200 and r.readline() == b"0\n"
        conn.close()  # mid-body
    conn = http.client.HTTPConnection(srv.host, srv.http_port, timeout=30)
    conn.request("GET", "/v1/functions/function_probe/stream?3")
    r = conn.getresponse()
    assert r.read() == b"0\n1\n2\n"
    conn.close()


ENSEMBLE_OVER_REPEAT = """
name: "repeat_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "repeat_int32" model_version: -1
  input_map { key: "IN" value: "IN" } input_map { key: "DELAY" value: "DELAY" }
  input_map { key: "WAIT" value: "WAIT" } output_map { key: "OUT" value: "OUT" } } ] }
"""


def test_an_ensemble_over_a_decoupled_model_streams_its_responses(request, tmp_path):
    """An ensemble whose step is decoupled is decoupled itself, as in Triton (its configuration
    does not say so): a stream gets every response of the step, in order, then the final flag;
    a unary call gets the one response of a run that sends one, and a clear refusal otherwise."""
    shutil.copytree(REPO_ROOT / "model_repository" / "repeat_int32", tmp_path / "repeat_int32")
    (tmp_path / "repeat_ensemble" / "1").mkdir(parents=True)
    (tmp_path / "repeat_ensemble" / "config.pbtxt").write_text(ENSEMBLE_OVER_REPEAT)
    failed_before = request.session.testsfailed
    srv, proc, log = launch(binary(), ["--model-repository", str(tmp_path)])
    try:
        status, _, body = srv.request("GET", "/v2/models/repeat_ensemble/config")
        assert status == 200 and json.loads(body)["model_transaction_policy"]["decoupled"] is True
        stream = Stream(srv)
        try:
            values = list(range(100, 106))
            stream.client.async_stream_infer("repeat_ensemble", repeat_inputs(values, [5] * 6, 0),
                                             request_id="r1", enable_empty_final_response=True)
            got = [stream.get() for _ in range(len(values) + 1)]
            assert all(error is None for _, error in got), got
            assert [r.as_numpy("OUT").tolist() for r, _ in got[:-1]] == [[v] for v in values]
            assert [final_flag(r) for r, _ in got] == [False] * len(values) + [True]
            assert {r.get_response().id for r, _ in got} == {"r1"}
        finally:
            stream.close()
        client = grpcclient.InferenceServerClient(url=f"{srv.host}:{srv.grpc_port}")
        try:
            assert client.infer("repeat_ensemble", repeat_inputs([7], [0], 0)).as_numpy("OUT").tolist() == [7]
            with pytest.raises(InferenceServerException) as e:
                client.infer("repeat_ensemble", repeat_inputs([1, 2], [0, 0], 0))
            assert "stream of responses" in e.value.message(), e.value.message()
        finally:
            client.close()
    finally:
        stop(proc, log, keep=request.session.testsfailed > failed_before)


def test_many_pipelined_requests_on_one_stream_all_complete(server):
    """80 requests of 50 responses each pipelined on one gRPC stream to repeat_int32 (one
    instance, which interleaves its streams): every request that was started is read, so none
    waits on another (a limit on the streams read at once stalled them all)."""
    stream = Stream(server)
    try:
        for i in range(80):
            stream.client.async_stream_infer("repeat_int32",
                                             repeat_inputs(list(range(50)), [0] * 50, 0),
                                             request_id=str(i), enable_empty_final_response=True)
        finals, counts = 0, {}
        while finals < 80:
            result, error = stream.get()
            assert error is None, error
            response = result.get_response()
            if final_flag(result):
                finals += 1
            else:
                counts[response.id] = counts.get(response.id, 0) + 1
        assert counts == {str(i): 50 for i in range(80)}
    finally:
        stream.close()


def test_a_client_that_stops_reading_loses_its_request_not_the_model(request, tmp_path):
    """stream_probe with a 1.5 s execution deadline: a reader that takes nothing for that long
    has its request ended with a timeout, the handler stops at its next send, and another
    client's request on the same (one-instance) model goes through."""
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "model_repository" / "stream_probe",
                    tmp_path / "stream_probe")
    config = tmp_path / "stream_probe" / "config.pbtxt"
    config.write_text(config.read_text() + '\nparameters [ { key: "execute_deadline_ms" '
                      'value: { string_value: "1500" } } ]\n')
    failed_before = request.session.testsfailed
    srv, proc, log = launch(binary(), ["--model-repository", str(tmp_path)])
    channel, stub = _stub(srv)
    release = threading.Event()

    def requests():
        yield probe_request(100_000, 64 << 10)
        release.wait(60)

    try:
        stalled = stub.ModelStreamInfer(requests(), timeout=60)
        assert next(stalled).error_message == ""
        # Meanwhile the stalled reader reads nothing; another client is served.
        started = time.monotonic()
        answers = list(stub.ModelStreamInfer(iter([probe_request(3, 8)]), timeout=30))
        assert len(answers) == 3 and all(a.error_message == "" for a in answers)
        assert time.monotonic() - started < 15
        # The stalled reader gets what was buffered, then the reason its request ended.
        last = None
        for answer in stalled:
            last = answer
            if answer.error_message:
                break
        assert last is not None and "read nothing" in last.error_message, last
    finally:
        release.set()
        channel.close()
        stop(proc, log, keep=request.session.testsfailed > failed_before)
