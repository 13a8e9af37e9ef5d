"""The LLM engine (`tensorrt_llm`, backend llamacpp, SmolLM2-135M-Instruct) against the real
`tritonclient.grpc`: greedy output equal to llama.cpp's own, streams equal to single responses,
in-flight batching, cancellation, and bad input.

The reference is llama.cpp itself through `llama-cpp-2` with no server
(`target/*/examples/llm_bare greedy`), each prompt alone in its own context.
"""
from __future__ import annotations

import json
import queue
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc as grpc_lib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import MODEL_REPOSITORY, binary, metric, wait_for

GGUF = MODEL_REPOSITORY / "tensorrt_llm" / "1" / "model.gguf"
TOKENIZER = MODEL_REPOSITORY / "tensorrt_llm" / "1" / "tokenizer.json"
MODEL = "tensorrt_llm"

# English, Chinese, emoji, code, and a chat-templated question.
PROMPTS = [
    "The capital of France is",
    "请介绍一下你自己。",
    "Emoji time: 🎉🎉 and then 👍🏽",
    "def fibonacci(n):",
    "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "日本の首都は",
]


def parallel(count: int, run):
    """`run(i)` for i in 0..count on threads at once; their results in order (a failure in
    any of them fails the test)."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def llm_metric(server, name: str, **labels) -> float:
    """An engine metric of the LLM model; 0 when the sample does not exist yet."""
    try:
        return metric(server, name, model=MODEL, **labels)
    except AssertionError:
        return 0.0


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    if not TOKENIZER.is_file():
        pytest.fail(f"{TOKENIZER} missing: run scripts/fetch_models.sh", pytrace=False)
    return Tokenizer.from_file(str(TOKENIZER))


def llm_bare() -> Path:
    bare = binary().parent / "examples" / "llm_bare"
    if not bare.is_file():
        pytest.fail(f"{bare} missing: `cargo build --examples` builds it", pytrace=False)
    return bare


def reference(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """llama.cpp's own greedy output, one prompt at a time."""
    stdin = "\n".join(json.dumps(p) for p in prompts) + "\n"
    out = subprocess.run([str(llm_bare()), "greedy", str(GGUF), str(max_tokens)], input=stdin,
                         capture_output=True, text=True, check=True, timeout=300)
    return [json.loads(line) for line in out.stdout.splitlines()]


def tensor(name: str, value) -> grpcclient.InferInput:
    array = np.asarray(value)
    dtype = {np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL", np.uint64: "UINT64"}[array.dtype.type]
    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


def request(ids: list[int], max_tokens: int, **extra) -> list[grpcclient.InferInput]:
    inputs = [tensor("input_ids", np.array([ids], dtype=np.int32)),
              tensor("request_output_len", np.array([[max_tokens]], dtype=np.int32))]
    for name, value in extra.items():
        inputs.append(tensor(name, value))
    return inputs


def grpc_client(server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")


def generate(server, ids: list[int], max_tokens: int, **extra) -> list[int]:
    """A unary call, as the TensorRT-LLM guide's client makes it: the prompt, then the output."""
    client = grpc_client(server)
    try:
        result = client.infer(MODEL, request(ids, max_tokens, **extra))
    finally:
        client.close()
    output = result.as_numpy("output_ids")
    assert output.shape[:2] == (1, 1)
    tokens = output[0][0].tolist()
    assert tokens[:len(ids)] == ids
    assert result.as_numpy("sequence_length").tolist() == [[len(tokens)]]
    return tokens[len(ids):]


def stream(server, ids: list[int], max_tokens: int, **extra) -> list[list[int]]:
    """A streamed request: the tokens of each response, until the final one."""
    client = grpc_client(server)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(MODEL, request(ids, max_tokens, streaming=np.array([[True]]), **extra))
        responses = []
        while True:
            result, error = answers.get(timeout=120)
            assert error is None, error
            responses.append(result.as_numpy("output_ids")[0][0].tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def test_greedy_output_equals_llama_cpp_with_16_requests_in_flight(server, tokenizer):
    """Each prompt four times at once (24 requests, 16 slots): every answer equals llama.cpp's
    greedy output for that prompt alone, although the engine ran them in shared batches."""
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    expected = reference(prompts, 40)
    steps_before = llm_metric(server, "tessera_llm_step_sequences_count")
    solo_before = llm_metric(server, "tessera_llm_step_sequences_bucket", le="1")
    answers = parallel(24, lambda i: generate(server, prompts[i % len(prompts)], 40))
    for i, answer in enumerate(answers):
        assert answer == expected[i % len(prompts)], f"prompt {PROMPTS[i % len(prompts)]!r}"
    steps = llm_metric(server, "tessera_llm_step_sequences_count") - steps_before
    solo = llm_metric(server, "tessera_llm_step_sequences_bucket", le="1") - solo_before
    assert steps > 0 and solo < steps, "no step decoded more than one sequence"
    # The counts went up for the requests we sent.
    assert llm_metric(server, "tessera_llm_generation_tokens_total", tenant="") >= sum(
        len(a) for a in answers)


def test_a_sequence_moved_into_a_freed_kv_region_still_answers_as_llama_cpp(server, tokenizer):
    """Three requests take KV regions 0, 1 and 2; the middle one ends first, and the engine
    moves the third down into its region (llama.cpp copies that sequence's cache), so the next
    steps' sequences stay consecutive. Every answer still equals llama.cpp's greedy output for
    its prompt alone."""
    prompts = [tokenizer.encode(p).ids for p in (PROMPTS[1], PROMPTS[0], PROMPTS[3])]
    # The middle one runs long enough (56 steps) for the third to be admitted while it runs,
    # however slowly the test's own threads and metric polls go on a loaded machine.
    lengths = [128, 56, 120]
    expected = [reference([p], n)[0] for p, n in zip(prompts, lengths)]
    assert len(expected[1]) == 56, "the middle answer ends early"
    assert len(expected[0]) > 64 and len(expected[2]) > 64, "the long answers end early"
    moves_before = llm_metric(server, "tessera_llm_kv_region_moves_total")
    wait_for(lambda: llm_metric(server, "tessera_llm_sequences_running") == 0)
    with ThreadPoolExecutor(3) as pool:
        answers = []
        for i, (ids, n) in enumerate(zip(prompts, lengths)):
            answers.append(pool.submit(generate, server, ids, n))
            if i < 2:  # the next takes the lowest free region once this one decodes
                wait_for(lambda: llm_metric(server, "tessera_llm_sequences_running") >= i + 1
                         and llm_metric(server, "tessera_llm_sequences_prefilling") == 0)
        answers = [a.result(timeout=120) for a in answers]
    assert answers == expected
    moves = llm_metric(server, "tessera_llm_kv_region_moves_total") - moves_before
    assert moves >= 1, "the third sequence was not moved into the freed region"


def test_streamed_tokens_equal_the_single_response_and_never_split_a_character(server, tokenizer):
    for text in PROMPTS:
        ids = tokenizer.encode(text).ids
        whole = generate(server, ids, 32)
        responses = stream(server, ids, 32)
        assert [t for r in responses for t in r] == whole, text
        # Every response decodes on its own into whole characters (no U+FFFD), and the
        # pieces concatenated are the whole text, byte for byte.
        pieces = [tokenizer.decode(r, skip_special_tokens=False) for r in responses]
        assert all("\ufffd" not in p for p in pieces), (text, pieces)
        assert "".join(pieces) == tokenizer.decode(whole, skip_special_tokens=False)


def test_a_stream_ends_with_the_finish_reason(server, tokenizer):
    ids = tokenizer.encode(PROMPTS[4]).ids
    client = grpc_client(server)
    try:
        result = client.infer(MODEL, request(ids, 200))
        assert result.get_response().parameters["finish_reason"].string_param == "stop"
        result = client.infer(MODEL, request(ids, 3))
        assert result.get_response().parameters["finish_reason"].string_param == "length"
        assert result.as_numpy("sequence_length").tolist() == [[len(ids) + 3]]
    finally:
        client.close()


def test_sampling_is_seeded_and_validated(server, tokenizer):
    ids = tokenizer.encode("Once upon a time").ids
    warm = dict(temperature=np.array([[0.9]], dtype=np.float32),
                runtime_top_p=np.array([[0.95]], dtype=np.float32),
                runtime_top_k=np.array([[40]], dtype=np.int32),
                repetition_penalty=np.array([[1.1]], dtype=np.float32))
    a = generate(server, ids, 24, random_seed=np.array([[7]], dtype=np.uint64), **warm)
    b = generate(server, ids, 24, random_seed=np.array([[7]], dtype=np.uint64), **warm)
    c = generate(server, ids, 24, random_seed=np.array([[8]], dtype=np.uint64), **warm)
    assert a == b, "the same seed gives the same tokens"
    assert a != c, "another seed gives other tokens"
    # log-probabilities: one per token, each <= 0, summed in cum_log_probs.
    client = grpc_client(server)
    try:
        result = client.infer(MODEL, request(ids, 5, return_log_probs=np.array([[True]])))
        log_probs = result.as_numpy("output_log_probs")[0][0]
        assert len(log_probs) == 5 and all(lp <= 0 for lp in log_probs)
        assert abs(result.as_numpy("cum_log_probs")[0][0] - log_probs.sum()) < 1e-3
        # Tessera's top_log_probs: the k most likely at each place, most likely first; greedy,
        # so the chosen token is the first of them.
        result = client.infer(MODEL, request(ids, 5, exclude_input_in_output=np.array([[True]]),
                                             top_log_probs=np.array([[3]], dtype=np.int32)))
        top_ids = result.as_numpy("output_top_log_prob_ids")[0][0]
        top = result.as_numpy("output_top_log_probs")[0][0]
        assert top_ids.shape == top.shape == (5, 3)
        assert top_ids[:, 0].tolist() == result.as_numpy("output_ids")[0][0].tolist()
        assert np.allclose(top[:, 0], result.as_numpy("output_log_probs")[0][0], atol=1e-6)
        assert (np.diff(top, axis=1) <= 0).all()
    finally:
        client.close()
    # Streamed, each response's cum_log_probs is the sum over the sequence so far, as
    # TensorRT-LLM's is.
    client = grpc_client(server)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(MODEL, request(ids, 8, streaming=np.array([[True]]),
                                                 return_log_probs=np.array([[True]])))
        total, responses = 0.0, 0
        while True:
            result, error = answers.get(timeout=120)
            assert error is None, error
            total += float(result.as_numpy("output_log_probs")[0][0].sum())
            assert abs(result.as_numpy("cum_log_probs")[0][0] - total) < 1e-3
            responses += 1
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert responses >= 8
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("extra, max_tokens, ids, says", [
    ({}, 4, list(range(5, 1600)), "context per sequence"),
    ({}, 1_000_000, [5, 6], "request_output_len"),
    ({}, 0, [5, 6], "request_output_len"),
    ({}, 4, [5, 99_999], "not a token"),
    ({}, 4, [], "empty"),
    ({"temperature": np.array([[np.nan]], dtype=np.float32)}, 4, [5], "temperature"),
    ({"temperature": np.array([[-1]], dtype=np.float32)}, 4, [5], "temperature"),
    ({"runtime_top_p": np.array([[1.5]], dtype=np.float32)}, 4, [5], "runtime_top_p"),
    ({"repetition_penalty": np.array([[0]], dtype=np.float32)}, 4, [5], "repetition_penalty"),
    ({"beam_width": np.array([[4]], dtype=np.int32)}, 4, [5], "beam_width"),
])
def test_bad_requests_get_a_clear_error_and_harm_nobody(server, tokenizer, extra, max_tokens, ids, says):
    client = grpc_client(server)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer(MODEL, request(ids, max_tokens, **extra))
        assert "INVALID_ARGUMENT" in str(e.value.status()), e.value
        assert says in e.value.message()
    finally:
        client.close()
    good = tokenizer.encode(PROMPTS[0]).ids
    assert len(generate(server, good, 4)) == 4


def test_streaming_over_a_unary_call_is_refused(server, tokenizer):
    client = grpc_client(server)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer(MODEL, request([5, 6], 50, streaming=np.array([[True]])))
        assert "ModelStreamInfer" in e.value.message()
    finally:
        client.close()
    # The refused request's slot is freed (its stream was dropped, which cancels it).
    wait_for(lambda: llm_metric(server, "tessera_llm_sequences_running") == 0)


def rss_bytes(server) -> int | None:
    """The server's resident memory (None when the tests run against an external server)."""
    if server.process is None:
        return None
    with open(f"/proc/{server.process.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def raw_stream_request(ids: list[int], max_tokens: int) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    for name, values, dtype in (("input_ids", ids, "INT32"), ("request_output_len", [max_tokens], "INT32"),
                                ("streaming", [True], "BOOL")):
        t = req.inputs.add(name=name, datatype=dtype, shape=[1, len(values)])
        if dtype == "BOOL":
            t.contents.bool_contents.extend(values)
        else:
            t.contents.int_contents.extend(values)
    return req


def test_cancelled_streams_free_their_slots_within_a_step(server, tokenizer):
    """1,000 streams cancelled after their first token leave no slot, sequence or KV cell
    behind, and a later request of every slot still runs."""
    ids = tokenizer.encode(PROMPTS[0]).ids
    channel = grpc_lib.insecure_channel(f"{server.host}:{server.grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    cancelled_before = llm_metric(server, "tessera_llm_requests_cancelled_total")
    rss_before = rss_bytes(server)
    try:
        def cancel_many(worker: int):
            for _ in range(125):
                call = stub.ModelStreamInfer(iter([raw_stream_request(ids, 1000)]))
                first = next(call)
                assert not first.error_message, first.error_message
                call.cancel()
        parallel(8, cancel_many)
    finally:
        channel.close()
    wait_for(lambda: llm_metric(server, "tessera_llm_sequences_running") == 0)
    assert llm_metric(server, "tessera_llm_kv_cache_used_tokens") == 0
    cancelled = llm_metric(server, "tessera_llm_requests_cancelled_total") - cancelled_before
    assert cancelled >= 990, f"only {cancelled} of 1000 streams were counted as cancelled"
    if rss_before is not None:
        grown = rss_bytes(server) - rss_before
        assert grown < 64 << 20, f"the server grew by {grown >> 20} MiB over 1,000 cancelled streams"
    answers = parallel(16, lambda i: generate(server, ids, 8))
    assert all(len(a) == 8 for a in answers)


def test_a_long_prompt_joins_decoding_streams_in_chunks(server, tokenizer):
    """While 8 streams decode, a 1,024-token prompt is prefilled in chunks of at most 8
    tokens per step (prefill_chunk_tokens' default, or as many as sequences decode if more), so
    the running streams keep getting a token every step, each step at most about twice a
    decoding one; and its own answer is still right."""
    short = tokenizer.encode(PROMPTS[0]).ids
    long_prompt = (tokenizer.encode("The history of the sea: " * 200).ids)[:1024]
    histogram = "tessera_llm_step_prompt_tokens_while_decoding_bucket"

    def over_chunk() -> float:
        return llm_metric(server, histogram, le="+Inf") - llm_metric(server, histogram, le="8")

    decoding = threading.Event()
    before = []

    def decode(i: int):
        # Long enough (and never ending early) to outlast the long prompt's prefill.
        return stream(server, short, 400, min_length=np.array([[400]], dtype=np.int32))

    def late_long(_):
        # Once the 8 streams are all decoding: only then does the long prompt come.
        wait_for(lambda: llm_metric(server, "tessera_llm_sequences_running") >= 8
                 and llm_metric(server, "tessera_llm_sequences_prefilling") == 0, timeout=60)
        before.append(over_chunk())
        decoding.set()
        return generate(server, long_prompt, 4)

    results = parallel(9, lambda i: decode(i) if i < 8 else late_long(i))
    assert decoding.is_set()
    assert all(sum(len(r) for r in results[i]) > 0 for i in range(8))
    # The 8 streams were still decoding when the long prompt's answer came.
    over = over_chunk() - before[0]
    assert over == 0, f"{over} steps prefilled more than 8 prompt tokens while 8 others decoded"
    assert results[8] == reference([long_prompt], 4)[0]
