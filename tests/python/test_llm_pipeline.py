"""The LLM pipeline around the engine, in TensorRT-LLM's layout, with sandboxed Wasm handlers:
`preprocessing` (chat template, tokenizer), `postprocessing`, the `ensemble`, and the decoupled
`tensorrt_llm_bls` (text in, text streamed out); and the OpenAI-compatible API on top, with the
official `openai` client.
"""
from __future__ import annotations

import http.client
import json
import math
import socket
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from openai import BadRequestError, NotFoundError, OpenAI
from tokenizers import Tokenizer

from conftest import MODEL_REPOSITORY, metric, wait_for
from test_llm import MODEL, PROMPTS, grpc_client, llm_metric, parallel, reference, request

TOKENIZER = MODEL_REPOSITORY / "tensorrt_llm" / "1" / "tokenizer.json"
BLS = "tensorrt_llm_bls"
# SmolLM2's chat template, as the model ships it, puts this system prompt first.
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER))


def greedy(client: OpenAI) -> OpenAI:
    """`client`, asking for temperature 0 unless a call sets one: these tests compare with the
    engine's greedy text, and OpenAI's default temperature (the server's too) is 1."""
    for endpoint in (client.completions, client.chat.completions):
        def create(*args, _create=endpoint.create, **kwargs):
            kwargs.setdefault("temperature", 0)
            return _create(*args, **kwargs)
        endpoint.create = create
    return client


@pytest.fixture(scope="module")
def openai_client(server):
    client = greedy(OpenAI(base_url=f"http://{server.host}:{server.http_port}/v1",
                           api_key="unused", max_retries=0, timeout=120))
    yield client
    client.close()


def post(server, path: str, body) -> tuple[int, dict | str]:
    conn = http.client.HTTPConnection(server.host, server.http_port, timeout=120)
    conn.request("POST", path, body if isinstance(body, bytes) else json.dumps(body))
    response = conn.getresponse()
    data = response.read().decode()
    conn.close()
    try:
        return response.status, json.loads(data)
    except json.JSONDecodeError:
        return response.status, data


def sse(server, path: str, body: dict) -> list[str]:
    """The `data:` payloads of a Server-Sent Events answer."""
    conn = http.client.HTTPConnection(server.host, server.http_port, timeout=120)
    conn.request("POST", path, json.dumps(body))
    response = conn.getresponse()
    assert response.status == 200, response.read()
    events = [line[len("data: "):] for line in response.read().decode().splitlines()
              if line.startswith("data: ")]
    conn.close()
    return events


def greedy_text(tokenizer, prompt: str, max_tokens: int) -> str:
    ids = reference([tokenizer.encode(prompt).ids], max_tokens)[0]
    return tokenizer.decode(ids, skip_special_tokens=True)


def test_the_ensemble_answers_llama_cpps_greedy_text(server, tokenizer):
    for prompt in PROMPTS[:3]:
        status, body = post(server, "/v2/models/ensemble/generate",
                            {"text_input": prompt, "max_tokens": 24})
        assert status == 200, body
        assert body["text_output"] == greedy_text(tokenizer, prompt, 24), prompt


def test_the_ensemble_streams_as_tensorrt_llms_does(server):
    """The ensemble's engine step is decoupled, so the ensemble is (as in Triton, with no line
    of its configuration saying so): TensorRT-LLM's quick-start call, generate_stream with
    `stream` true, gets the text piece by piece, each engine response through postprocessing,
    and the pieces concatenate to the one-response text byte for byte."""
    conn = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    conn.request("GET", "/v2/models/ensemble/config")
    config = json.loads(conn.getresponse().read())
    conn.close()
    assert config["model_transaction_policy"]["decoupled"] is True
    for prompt in PROMPTS:
        status, whole = post(server, "/v2/models/ensemble/generate",
                             {"text_input": prompt, "max_tokens": 40})
        assert status == 200, whole
        events = [json.loads(e) for e in sse(server, "/v2/models/ensemble/generate_stream",
                                             {"text_input": prompt, "max_tokens": 40, "stream": True})]
        pieces = [e["text_output"] for e in events]
        assert len(pieces) > 1 and all(e["model_name"] == "ensemble" for e in events)
        # The engine cuts responses at character boundaries: only a generation that stops at
        # max_tokens inside a character ends with a replacement character, as its unary text does.
        assert all("\ufffd" not in p for p in pieces[:-1]), pieces
        assert "".join(pieces) == whole["text_output"], prompt
    # Asking a unary call for a stream is refused, not answered with its first piece.
    status, body = post(server, "/v2/models/ensemble/generate",
                        {"text_input": PROMPTS[0], "max_tokens": 8, "stream": True})
    assert status == 400 and "generate_stream" in body["error"], body


def ensemble_inputs(prompt: str, max_tokens: int, stream: bool) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("text_input", [1, 1], "BYTES"),
              grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
              grpcclient.InferInput("stream", [1, 1], "BOOL")]
    inputs[0].set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([[stream]]))
    return inputs


def test_the_ensemble_streams_over_grpc_to_the_end_of_a_generation(server):
    """tritonclient's stream against the ensemble, as TensorRT-LLM's end-to-end client calls it:
    a generation that stops on the model's end token ends with a response of no tokens, which
    goes through postprocessing too (as an empty piece) before the final flag."""
    client = grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    try:
        whole = client.infer("ensemble", ensemble_inputs(prompt, 300, False))
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("ensemble", ensemble_inputs(prompt, 300, True),
                                  enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = answers.get(timeout=120)
            assert error is None, error
            text = result.as_numpy("text_output")
            if text is not None:
                pieces.append(b"".join(text.reshape(-1)).decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    finally:
        client.close()
    text = b"".join(whole.as_numpy("text_output").reshape(-1)).decode()
    assert len(pieces) > 1 and "".join(pieces) == text
    # It stopped on the end token, well before 300 tokens.
    assert 0 < len(text) < 1000


def test_a_client_leaving_an_ensemble_stream_frees_the_engine_slot(server):
    """Closing a generate_stream connection mid-generation drops the ensemble's stream, which
    drops its engine stream: the sequence leaves the engine within a step."""
    cancelled_before = llm_metric(server, "tessera_llm_requests_cancelled_total")
    for _ in range(3):
        conn = http.client.HTTPConnection(server.host, server.http_port, timeout=120)
        conn.request("POST", "/v2/models/ensemble/generate_stream",
                     json.dumps({"text_input": PROMPTS[0], "max_tokens": 1000, "stream": True}))
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data: ")
        wait_for(lambda: llm_metric(server, "tessera_llm_sequences_running") >= 1)
        conn.close()
    wait_for(lambda: llm_metric(server, "tessera_llm_sequences_running") == 0)
    assert llm_metric(server, "tessera_llm_requests_cancelled_total") - cancelled_before == 3


def test_the_chat_template_is_the_models_own_rendered_by_jinja(server, tokenizer):
    messages = [{"role": "user", "content": "Hi there"}]
    client = grpcclient.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
    try:
        inputs = [grpcclient.InferInput("MESSAGES", [1, 1], "BYTES"),
                  grpcclient.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([[json.dumps(messages).encode()]], dtype=object))
        inputs[1].set_data_from_numpy(np.array([[8]], dtype=np.int32))
        result = client.infer("preprocessing", inputs)
    finally:
        client.close()
    expected = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
                "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert result.as_numpy("INPUT_ID")[0].tolist() == tokenizer.encode(expected).ids
    assert result.as_numpy("REQUEST_INPUT_LEN").tolist() == [[len(tokenizer.encode(expected).ids)]]
    assert result.as_numpy("OUT_END_ID").tolist() == [[2]]


def test_streamed_text_equals_the_single_answer_byte_for_byte(server):
    """Chinese, emoji and English through the BLS model: the pieces of a stream concatenate
    to exactly the one-response text, and no piece holds half a character."""
    for prompt in PROMPTS:
        status, whole = post(server, f"/v2/models/{BLS}/generate",
                             {"text_input": prompt, "max_tokens": 40})
        assert status == 200, whole
        pieces = [json.loads(e)["text_output"] for e in sse(
            server, f"/v2/models/{BLS}/generate_stream",
            {"text_input": prompt, "max_tokens": 40, "stream": True})]
        assert len(pieces) > 1
        assert all("\ufffd" not in p for p in pieces), pieces
        assert "".join(pieces) == whole["text_output"], prompt


def test_openai_chat_and_completions_with_the_official_client(openai_client, tokenizer):
    models = [m.id for m in openai_client.models.list()]
    assert BLS in models and "tensorrt_llm" not in models

    prompt = "The capital of France is"
    completion = openai_client.completions.create(model=BLS, prompt=prompt, max_tokens=24)
    assert completion.choices[0].text == greedy_text(tokenizer, prompt, 24)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens == len(tokenizer.encode(prompt).ids)
    assert completion.usage.completion_tokens == 24

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = openai_client.chat.completions.create(model=BLS, messages=messages, max_tokens=64)
    text = chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant" and text
    assert chat.choices[0].finish_reason in ("stop", "length")

    stream = openai_client.chat.completions.create(
        model=BLS, messages=messages, max_tokens=64, stream=True,
        stream_options={"include_usage": True})
    pieces, finishes, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert "".join(pieces) == text
    assert finishes == [chat.choices[0].finish_reason]
    assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens
    assert usage.prompt_tokens == chat.usage.prompt_tokens > 0


def utf8(data: bytes) -> bool:
    try:
        data.decode()
        return True
    except UnicodeDecodeError:
        return False


def engine_log_probs(server, ids: list[int], max_tokens: int) -> list[float]:
    """The engine's own log-probabilities for a greedy generation, asked over gRPC."""
    client = grpc_client(server)
    try:
        result = client.infer(MODEL, request(ids, max_tokens,
                                             return_log_probs=np.array([[True]])))
    finally:
        client.close()
    return [float(v) for v in result.as_numpy("output_log_probs")[0][0]]


def test_log_probabilities_are_the_engines_token_for_token(server, openai_client, tokenizer):
    """`logprobs` on both endpoints, streamed and not: one entry per generated token, in order,
    each the engine's own log-probability for it (asked of the engine directly), and the
    tokens' bytes add up to the text, Chinese included (a token may hold part of a
    character: its `bytes` hold it, its `token` shows U+FFFD)."""
    prompt = "The capital of France is"
    expected = engine_log_probs(server, tokenizer.encode(prompt).ids, 12)
    completion = openai_client.completions.create(model=BLS, prompt=prompt, max_tokens=12,
                                                  logprobs=0)
    choice = completion.choices[0]
    assert choice.logprobs.token_logprobs == pytest.approx(expected, abs=1e-3)
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert "".join(choice.logprobs.tokens) == choice.text
    lengths = [len(t) for t in choice.logprobs.tokens]
    assert choice.logprobs.text_offset == [sum(lengths[:i]) for i in range(len(lengths))]
    streamed = [c.choices[0].logprobs for c in openai_client.completions.create(
        model=BLS, prompt=prompt, max_tokens=12, logprobs=0, stream=True)
        if c.choices and c.choices[0].logprobs]
    assert [t for lp in streamed for t in lp.tokens] == choice.logprobs.tokens
    assert [v for lp in streamed for v in lp.token_logprobs] == pytest.approx(expected, abs=1e-3)
    assert [o for lp in streamed for o in lp.text_offset] == choice.logprobs.text_offset

    messages = [{"role": "user", "content": "请用中文介绍一下你自己。"}]
    chat = openai_client.chat.completions.create(model=BLS, messages=messages, max_tokens=24,
                                                 logprobs=True)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens  # end tokens are not part of either
    text = chat.choices[0].message.content.encode()
    joined = b"".join(bytes(t.bytes) for t in content)
    # A character the token limit cut off is left out of the text, not of the tokens.
    assert joined.startswith(text) and len(joined) - len(text) < 4, (joined, text)
    assert any(not utf8(bytes(t.bytes)) for t in content), "no token held part of a character"
    assert all(t.token == bytes(t.bytes).decode("utf-8", "replace") and t.top_logprobs == []
               for t in content)
    streamed = [t for c in openai_client.chat.completions.create(
        model=BLS, messages=messages, max_tokens=24, logprobs=True, stream=True)
        for choice in c.choices if choice.logprobs for t in choice.logprobs.content]
    assert [bytes(t.bytes) for t in streamed] == [bytes(t.bytes) for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-3)
    without = openai_client.chat.completions.create(model=BLS, messages=messages, max_tokens=4)
    assert without.choices[0].logprobs is None

    # Completions' text_offset counts characters of the text: a character split over two
    # tokens counts once, and the token that holds its end begins at it too.
    chinese = openai_client.completions.create(model=BLS, prompt="我的名字是", max_tokens=24,
                                               logprobs=0)
    logprobs, text = chinese.choices[0].logprobs, chinese.choices[0].text
    assert any("\ufffd" in t for t in logprobs.tokens), ("no split character", logprobs.tokens)
    offsets = logprobs.text_offset
    assert offsets == sorted(offsets) and offsets[-1] <= len(text), (offsets, len(text))
    assert len(set(offsets)) < len(offsets), "no two tokens began in the same character"


def test_the_most_likely_tokens_come_with_each_one(openai_client):
    """`top_logprobs` (chat) and `logprobs: n` (completions): n alternatives per token, the most
    likely first, each a log-probability of the same distribution; the generation is greedy,
    so the chosen token is the first of them, with the same log-probability."""
    messages = [{"role": "user", "content": "Name three colours."}]
    chat = openai_client.chat.completions.create(model=BLS, messages=messages, max_tokens=16,
                                                 logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert content
    for t in content:
        top = t.top_logprobs
        assert len(top) == 3
        assert [a.logprob for a in top] == sorted((a.logprob for a in top), reverse=True)
        assert top[0].bytes == t.bytes and top[0].logprob == pytest.approx(t.logprob, abs=1e-5)
        assert sum(math.exp(a.logprob) for a in top) <= 1.0 + 1e-4
    streamed = [t for c in openai_client.chat.completions.create(
        model=BLS, messages=messages, max_tokens=16, logprobs=True, top_logprobs=3, stream=True)
        for choice in c.choices if choice.logprobs for t in choice.logprobs.content]
    assert [[a.bytes for a in t.top_logprobs] for t in streamed] == \
        [[a.bytes for a in t.top_logprobs] for t in content]

    completion = openai_client.completions.create(model=BLS, prompt="The capital of France is",
                                                  max_tokens=8, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.top_logprobs) == len(logprobs.tokens) == 8
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        # The chosen token always, beside the two most likely (greedy: it is one of them).
        assert 1 <= len(top) <= 3 and top[token] == pytest.approx(value, abs=1e-5)
        assert max(top.values()) == pytest.approx(value, abs=1e-5)


@pytest.mark.parametrize("path, extra, says", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "from 0 to 20"),
    ("/v1/chat/completions", {"top_logprobs": 0}, "needs logprobs: true"),
    ("/v1/chat/completions", {"logprobs": 2}, "true or false"),
    ("/v1/completions", {"logprobs": 9}, "from 0 to 5"),
    ("/v1/completions", {"top_logprobs": 2}, "chat parameter"),
])
def test_log_probabilities_that_cannot_be_served_are_refused(server, path, extra, says):
    body = {"model": BLS, "max_tokens": 4}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path
                else {"prompt": "hi"})
    body.update(extra)
    status, answer = post(server, path, body)
    assert status == 400, answer
    assert says in answer["error"]["message"], answer


def test_stop_strings_end_the_text_before_them(openai_client, tokenizer):
    prompt = "1, 2, 3, 4,"
    full = openai_client.completions.create(model=BLS, prompt=prompt, max_tokens=30).choices[0].text
    assert " 7" in full, full
    stopped = openai_client.completions.create(model=BLS, prompt=prompt, max_tokens=30, stop=[" 7"])
    assert stopped.choices[0].text == full[:full.index(" 7")]
    assert stopped.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].text for c in openai_client.completions.create(
        model=BLS, prompt=prompt, max_tokens=30, stop=[" 7"], stream=True) if c.choices]
    assert "".join(pieces) == stopped.choices[0].text


def test_sixteen_openai_streams_at_once_are_all_right(openai_client, tokenizer):
    prompts = [PROMPTS[i % 4] for i in range(16)]
    expected = {p: greedy_text(tokenizer, p, 20) for p in set(prompts)}

    def one(i: int) -> str:
        stream = openai_client.completions.create(model=BLS, prompt=prompts[i], max_tokens=20,
                                                  stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    for i, text in enumerate(parallel(16, one)):
        assert text == expected[prompts[i]], prompts[i]


def test_a_closed_openai_stream_frees_its_engine_slot(server):
    for _ in range(20):
        conn = http.client.HTTPConnection(server.host, server.http_port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": BLS, "prompt": "Tell me a long story", "max_tokens": 1000, "stream": True}))
        response = conn.getresponse()
        assert response.status == 200
        assert response.read(6) == b"data: "  # the first event has begun
        conn.close()  # the client goes away mid-stream
    wait_for(lambda: metric(server, "tessera_llm_sequences_running", model="tensorrt_llm") == 0,
             timeout=30)


@pytest.mark.parametrize("path, body", [
    # At least 1,000 tokens (about ten seconds here): the slot frees long before they are done.
    ("/v2/models/tensorrt_llm_bls/generate", {"text_input": "Once upon a time",
                                              "max_tokens": 1000, "min_tokens": 1000}),
    ("/v1/completions", {"model": BLS, "prompt": "Once upon a time", "max_tokens": 1000,
                         "min_tokens": 1000}),
])
def test_a_client_leaving_a_unary_generation_frees_its_engine_slot(server, path, body):
    """A caller that waits for one answer and goes away mid-generation: the BLS handler
    holds the engine's stream for it, and is resumed to see the caller gone and drop it (it
    was not: the sequence sat in its slot, paused, for good)."""
    for _ in range(3):
        sock = socket.create_connection((server.host, server.http_port))
        data = json.dumps(body).encode()
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        wait_for(lambda: metric(server, "tessera_llm_sequences_running", model="tensorrt_llm") >= 1)
        steps = metric(server, "tessera_llm_steps_total", model="tensorrt_llm")
        sock.close()
        left = time.monotonic()
        # Counted in the engine's steps, which a loaded machine slows as much as the rest: 2-3
        # here, loaded or not (the handler sees the caller gone at its next token, the engine
        # the dropped stream at its next step); a slot kept running would take 1,000. The
        # engine takes no step while its only sequence is paused, so a slot held paused is
        # caught by the time instead, with room for a loaded machine (3 s was once overrun).
        wait_for(lambda: metric(server, "tessera_llm_sequences_running", model="tensorrt_llm") == 0,
                 timeout=10)
        steps = metric(server, "tessera_llm_steps_total", model="tensorrt_llm") - steps
        assert steps <= 6, f"the slot was freed {steps:.0f} steps and " \
                           f"{time.monotonic() - left:.1f} s after the client left"


HI = [{"role": "user", "content": "hi"}]


def test_sampling_without_a_seed_differs_between_requests_and_a_seed_repeats(openai_client):
    """As OpenAI's: no seed, a fresh one per request; the same seed, the same text."""
    def sample(**seed):
        return openai_client.completions.create(model=BLS, prompt="Once upon a time",
                                                max_tokens=16, temperature=1.5,
                                                **seed).choices[0].text
    unseeded = {sample() for _ in range(3)}
    assert len(unseeded) > 1, unseeded
    assert sample(seed=7) == sample(seed=7)
    # llama.cpp reads a 32-bit seed of all ones as "random": still the same text each time.
    assert sample(seed=4294967295) == sample(seed=4294967295)
    assert sample(seed=7 + (1 << 32)) != sample(seed=7), "seeds 2^32 apart differ"
    # top_p 0 keeps only the most likely token (the engine's own 0 means "off"), and so does
    # a p that is 0 as the engine's f32.
    assert len({sample(top_p=0) for _ in range(2)}) == 1
    assert len({sample(top_p=1e-50) for _ in range(3)}) == 1


def test_without_a_temperature_requests_sample_as_openais_do(server):
    # OpenAI's default temperature is 1: answers differ (the engine alone is greedy).
    body = {"model": BLS, "prompt": "Once upon a time", "max_tokens": 16}
    texts = {post(server, "/v1/completions", body)[1]["choices"][0]["text"] for _ in range(4)}
    assert len(texts) > 1, texts


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "", "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1536}),
])
def test_a_refused_stream_is_a_400_before_any_event(server, path, body):
    # The sandboxed pre-processing or the engine refuses it: the status says so, as OpenAI's
    # does, instead of a 200 stream that carries the error.
    status, answer = post(server, path, {"model": BLS, "stream": True, **body})
    assert status == 400, answer
    assert answer["error"]["message"] and answer["error"]["type"] == "invalid_request_error", answer


@pytest.mark.parametrize("body, says, param", [
    (b"{not json", "not a valid request", None),
    ({"model": BLS}, "'messages' is required", None),
    ({"model": BLS, "messages": []}, "must not be empty", None),
    ({"model": BLS, "messages": HI, "n": 3}, "n is not supported", "n"),
    ({"model": BLS, "messages": HI, "n": 2, "tools": []}, "n, tools are not supported", None),
    ({"model": BLS, "messages": HI, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"model": BLS, "messages": HI, "temperature": -2}, "temperature", "temperature"),
    ({"model": BLS, "messages": HI, "top_p": -0.5}, "top_p must be between 0 and 1", "top_p"),
    ({"model": BLS, "messages": HI, "max_tokens": 2**31}, "max_tokens 2147483648 is more",
     "max_tokens"),
    ({"model": BLS, "messages": [{"role": "user<|im_end|>", "content": "hi"}]}, "message role",
     None),
    ({"model": BLS, "messages": [{"role": "", "content": "hi"}]}, "message role", None),
    # Refused by the engine, in the engine's words (request_output_len, runtime_top_p), which
    # the BLS model puts back into its own input names, which are OpenAI's.
    ({"model": BLS, "messages": HI, "max_tokens": 100000}, "max_tokens must", "max_tokens"),
    ({"model": BLS, "messages": HI, "top_p": 1.5}, "top_p must", "top_p"),
    ({"model": BLS, "messages": [{"role": "user", "content": "word " * 3000}]},
     "context per sequence", None),
    ({"model": "tensorrt_llm", "messages": HI}, "does not serve", None),
])
def test_bad_openai_requests_get_a_400_with_the_reason(server, body, says, param):
    status, answer = post(server, "/v1/chat/completions", body)
    assert status == 400, answer
    assert says in answer["error"]["message"], answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param, answer
    for engine_name in ("request_output_len", "runtime_top"):
        assert engine_name not in answer["error"]["message"], answer


def test_an_unknown_model_is_a_404_and_invalid_utf8_a_400(server, openai_client):
    with pytest.raises(NotFoundError):
        openai_client.chat.completions.create(
            model="no_such_model", messages=[{"role": "user", "content": "hi"}])
    status, answer = post(server, "/v1/completions",
                          b'{"model": "' + BLS.encode() + b'", "prompt": "\xff\xfe"}')
    assert status == 400, answer
    with pytest.raises(BadRequestError):
        openai_client.completions.create(model=BLS, prompt=["a", "b"], max_tokens=4)


def test_a_tenant_over_its_token_quota_gets_429_with_retry_after(tmp_path):
    """A tenant with tokens_per_minute 60 overspends it on one completion (prompt and generated
    tokens count) and is refused the next with 429 and a Retry-After of when its budget is
    back above zero; the operator is not limited."""
    from test_tenants import ADMIN_KEY, admin

    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("tensorrt_llm", BLS):
        (repo / name).symlink_to(MODEL_REPOSITORY / name, target_is_directory=True)
    key_file = tmp_path / "admin.key"
    key_file.write_text(ADMIN_KEY)
    from conftest import binary, launch, stop
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--admin-key-file", str(key_file)])
    try:
        admin(srv, "POST", "/v1/tenants", {"name": "acme"})
        key = admin(srv, "POST", "/v1/tenants/acme/keys")["key"]
        for model in ("tensorrt_llm", BLS):
            admin(srv, "POST", f"/v1/tenants/acme/grants/{model}")
        admin(srv, "PUT", "/v1/tenants/acme/quotas", {"tokens_per_minute": 60})
        base = f"http://{srv.host}:{srv.http_port}/v1"
        tenant = greedy(OpenAI(base_url=base, api_key=key, max_retries=0))
        # Far more than a minute's tokens (the budget refills while it generates).
        first = tenant.completions.create(model=BLS, prompt="Once upon a time", max_tokens=160)
        assert first.usage.total_tokens > 120
        from openai import RateLimitError
        with pytest.raises(RateLimitError) as refused:
            tenant.completions.create(model=BLS, prompt="Once upon a time", max_tokens=8)
        retry_after = int(refused.value.response.headers["retry-after"])
        assert 1 <= retry_after <= 160
        assert "tokens_per_minute" in refused.value.message
        operator = OpenAI(base_url=base, api_key=ADMIN_KEY, max_retries=0)
        assert operator.completions.create(model=BLS, prompt="Hi", max_tokens=4).choices
        tenant.close()
        operator.close()
    finally:
        stop(proc, log)


def test_the_ensemble_is_refused_by_the_openai_endpoints_and_served_by_generate(server):
    """The ensemble's answers carry neither the engine's finish reason nor token counts, so the
    OpenAI endpoints refuse it, saying so and where it is served (they answered `stop` where
    the token limit ended the text, with zero usage), and /v1/models does not list it."""
    status, generated = post(server, "/v2/models/ensemble/generate",
                             {"text_input": "1, 2, 3,", "max_tokens": 8})
    assert status == 200 and generated["text_output"], generated
    for stream in (False, True):
        status, answer = post(server, "/v1/completions", {
            "model": "ensemble", "prompt": "1, 2, 3,", "max_tokens": 8, "stream": stream})
        assert status == 400, answer
        assert "does not report why generation stopped" in answer["error"]["message"], answer
        assert "/v2/models/ensemble/generate" in answer["error"]["message"], answer
    status, _, listed = server.request("GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(listed)["data"]] == [BLS]

