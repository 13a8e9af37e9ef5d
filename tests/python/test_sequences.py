"""Stateful models (sequence batching) against the real `tritonclient`: Triton's simple_sequence
flow (numeric and string correlation ids, over gRPC and HTTP), implicit state kept by the host
for a Wasm handler and an ONNX model alike, interleaved sequences, idle expiry, a full set of
slots, a reload, and Triton's errors for requests outside a sequence.
"""
from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import binary, in_threads, launch, metric, stop, wait_for

VALUES = [11, 7, 5, 3, 2, 0, 1]

ACCUMULATOR_CONFIG = """
name: "onnx_accumulator"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] }
  ]
  state [
    { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 1 ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def accumulator_onnx(path):
    """OUTPUT = ACC_OUT = ACC_IN * (1 - START) + INPUT: a running sum reset at START."""
    def fp32(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 1])

    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Sub", ["one", "START"], ["keep"]),
         helper.make_node("Mul", ["ACC_IN", "keep"], ["kept"]),
         helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"])],
        "onnx_accumulator", [fp32("INPUT"), fp32("START"), fp32("ACC_IN")],
        [fp32("OUTPUT"), fp32("ACC_OUT")], initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def seq_server(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequences")
    (repo / "onnx_accumulator" / "1").mkdir(parents=True)
    (repo / "onnx_accumulator" / "config.pbtxt").write_text(ACCUMULATOR_CONFIG)
    accumulator_onnx(repo / "onnx_accumulator" / "1" / "model.onnx")
    failed_before = request.session.testsfailed
    srv, proc, log = launch(binary(), [
        "--model-repository", "model_repository",
        "--model-repository", "tests/fixtures/model_repository",
        "--model-repository", str(repo),
        "--model-control-mode", "explicit",
        "--load-model", "simple_sequence", "--load-model", "sequence_sum",
        "--load-model", "onnx_accumulator"])
    yield srv
    stop(proc, log, keep=request.session.testsfailed > failed_before)


def grpc_client(srv):
    return grpcclient.InferenceServerClient(url=f"{srv.host}:{srv.grpc_port}")


def int_input(module, value):
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return tensor


def test_simple_sequence_answers_as_tritons_sequence_examples(seq_server):
    """The flow of Triton's simple_{grpc,http}_sequence_sync_infer_client.py: two numeric
    sequences and one string-id sequence; OUTPUT = INPUT + START on simple_sequence."""
    for module, client in ((grpcclient, grpc_client(seq_server)),
                           (httpclient, httpclient.InferenceServerClient(seq_server.url))):
        ids = (1000, 1001, str(uuid.uuid4()))
        firsts = (0, 100, 20)
        results = {i: [] for i in ids}
        # Interleaved step by step, as the stream example does.
        steps = [[first] + [sign * v for v in VALUES]
                 for first, sign in zip(firsts, (1, -1, -1))]
        for step in range(len(steps[0])):
            for sequence_id, values in zip(ids, steps):
                result = client.infer("simple_sequence", [int_input(module, values[step])],
                                      sequence_id=sequence_id, sequence_start=step == 0,
                                      sequence_end=step == len(values) - 1)
                results[sequence_id].append(int(result.as_numpy("OUTPUT")[0][0]))
        assert results[1000] == [1] + VALUES
        assert results[1001] == [101] + [-v for v in VALUES]
        assert results[ids[2]] == [21] + [-v for v in VALUES]
        client.close()


def test_requests_outside_a_sequence_get_tritons_errors(seq_server):
    client = httpclient.InferenceServerClient(seq_server.url)
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple_sequence", [int_input(httpclient, 1)])
    assert e.value.status() == "400"
    assert "must specify a non-zero or non-empty correlation ID" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple_sequence", [int_input(httpclient, 1)], sequence_id=424242)
    assert "must specify the START flag on the first request of the sequence" in e.value.message()
    # Two rows in one sequence request: Triton's answer, not a shape error about a control
    # tensor the client never sent.
    rows = httpclient.InferInput("INPUT", [2, 1], "INT32")
    rows.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple_sequence", [rows], sequence_id=424243, sequence_start=True)
    assert e.value.status() == "400"
    assert "must specify batch-size 1 due to requirements of sequence batcher" in e.value.message()
    client.close()


def sum_step(client, sequence_id, value, start=False, end=False):
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT64")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int64))
    result = client.infer("sequence_sum", [tensor], sequence_id=sequence_id,
                          sequence_start=start, sequence_end=end)
    return (int(result.as_numpy("SUM")[0][0]), result.as_numpy("ID")[0][0].decode(),
            float(result.as_numpy("ENDED")[0][0]))


def test_a_correlation_id_past_2_63_is_a_valid_uint64(seq_server):
    """Triton's correlation ids are uint64: 2^64 - 1 is one, over HTTP (a JSON number) and
    over gRPC (uint64_param; tritonclient itself sends int64_param)."""
    top = (1 << 64) - 1
    client = httpclient.InferenceServerClient(seq_server.url)
    for value, start, end in ((5, True, False), (7, False, True)):
        tensor = httpclient.InferInput("INPUT", [1, 1], "INT64")
        tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int64))
        result = client.infer("sequence_sum", [tensor], sequence_id=top,
                              sequence_start=start, sequence_end=end)
    assert int(result.as_numpy("SUM")[0][0]) == 12
    assert result.as_numpy("ID")[0][0].decode() == str(top)
    client.close()
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    import grpc

    with grpc.insecure_channel(f"{seq_server.host}:{seq_server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        sums = []
        for value, start, end in ((2, True, False), (3, False, True)):
            request = service_pb2.ModelInferRequest(model_name="sequence_sum")
            request.inputs.add(name="INPUT", datatype="INT64", shape=[1, 1])
            request.raw_input_contents.append(np.int64(value).tobytes())
            request.parameters["sequence_id"].uint64_param = top - 1
            request.parameters["sequence_start"].bool_param = start
            request.parameters["sequence_end"].bool_param = end
            response = stub.ModelInfer(request, timeout=30)
            outputs = {o.name: i for i, o in enumerate(response.outputs)}
            sums.append(int(np.frombuffer(response.raw_output_contents[outputs["SUM"]],
                                          dtype=np.int64)[0]))
        assert sums == [2, 5]


def test_interleaved_sequences_keep_their_own_state_in_a_wasm_handler(seq_server):
    """Four sequences at once from four threads on a two-instance handler: each step sees its
    own running sum (the host keeps the state; any instance runs any step), the CORRID and END
    controls arrive, and numeric ids reach a string CORRID as text."""
    failures = []

    def run(k):
        client = grpc_client(seq_server)
        sequence_id = 5000 + k if k % 2 else f"seq-{k}"
        total = 0
        try:
            for step in range(30):
                value = k * 100 + step
                total += value
                last = step == 29
                got = sum_step(client, sequence_id, value, start=step == 0, end=last)
                if got != (total, str(sequence_id), 1.0 if last else 0.0):
                    failures.append((k, step, got, total))
        except Exception as e:  # noqa: BLE001 - a thread's failure must reach the assertion
            failures.append((k, "exception", repr(e)))
        finally:
            client.close()

    in_threads(run, 4)
    assert failures == []


def test_an_onnx_model_gets_its_implicit_state_from_the_host(seq_server):
    client = grpc_client(seq_server)
    try:
        def step(sequence_id, value, start=False):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
            result = client.infer("onnx_accumulator", [tensor], sequence_id=sequence_id,
                                  sequence_start=start)
            assert result.as_numpy("ACC_OUT") is None, "the state output is the host's"
            return float(result.as_numpy("OUTPUT")[0][0])

        assert [step(77, 1.0, start=True), step(78, 10.0, start=True), step(77, 2.0),
                step(78, 20.0), step(77, 3.0)] == [1.0, 10.0, 3.0, 30.0, 6.0]
        assert step(77, 5.0, start=True) == 5.0, "a new START resets the state"
    finally:
        client.close()


def test_idle_sequences_are_released_and_a_full_set_of_slots_makes_the_next_wait(seq_server):
    """sequence_sum has 4 slots (oldest, max_candidate_sequences: 4) and a 3 s idle limit
    (long enough that no other test's sequence expires between its steps on a loaded machine)."""
    client = grpc_client(seq_server)
    try:
        expired = metric(seq_server, "tessera_sequences_expired_total", "sequence_sum")
        sum_step(client, 9001, 5, start=True)
        wait_for(lambda: metric(seq_server, "tessera_sequences_expired_total", "sequence_sum")
                 > expired)
        with pytest.raises(InferenceServerException) as e:
            sum_step(client, 9001, 1)
        assert "must specify the START flag" in e.value.message()

        for k in range(4):
            sum_step(client, 9100 + k, k, start=True)
        assert metric(seq_server, "tessera_sequences_live", "sequence_sum") == 4
        answered = []
        fifth = threading.Thread(target=lambda: answered.append(
            sum_step(grpc_client(seq_server), 9200, 7, start=True)))
        fifth.start()
        # The fifth is known (waiting for a slot): its next request waits behind it, as in
        # Triton's backlog, instead of being refused.
        wait_for(lambda: metric(seq_server, "tessera_sequences_live", "sequence_sum") == 5)
        second = threading.Thread(target=lambda: answered.append(
            sum_step(grpc_client(seq_server), 9200, 3)))
        second.start()
        # Keep the four alive (under the idle limit) while the fifth waits for a slot.
        for _ in range(3):
            time.sleep(0.1)
            for k in range(4):
                sum_step(client, 9100 + k, 0)
        assert answered == [], "the fifth sequence got a slot while all four were taken"
        sum_step(client, 9100, 0, end=True)
        fifth.join(timeout=10)
        second.join(timeout=10)
        assert answered == [(7, "9200", 0.0), (10, "9200", 0.0)]
    finally:
        client.close()


def test_a_reloaded_model_refuses_the_sequences_of_before(seq_server):
    client = grpc_client(seq_server)
    try:
        sum_step(client, 9300, 1, start=True)
        assert sum_step(client, 9300, 2)[0] == 3
        client.load_model("sequence_sum")  # unchanged: keeps serving, sequences and all
        assert sum_step(client, 9300, 3)[0] == 6
        config = client.get_model_config("sequence_sum", as_json=True)["config"]
        config["sequence_batching"]["max_sequence_idle_microseconds"] = "4000000"
        client.load_model("sequence_sum", config=__import__("json").dumps(config))
        with pytest.raises(InferenceServerException) as e:
            sum_step(client, 9300, 4)
        assert "must specify the START flag" in e.value.message()
        assert sum_step(client, 9300, 4, start=True)[0] == 4
    finally:
        client.close()
