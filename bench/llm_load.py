#!/usr/bin/env python3
"""Load for generative models: time to first token, inter-token latency and output tokens/s at
a number of concurrent streams, the same for any server, from one process.

    llm_load.py grpc   HOST:PORT PID LABEL MODEL STREAMS,... [options]
    llm_load.py openai HOST:PORT PID LABEL MODEL STREAMS,... [options]
    llm_load.py ensemble HOST:PORT PID LABEL MODEL STREAMS,... [options]
    llm_load.py bare-row LABEL < llm_bare-report.json

grpc: KServe v2 gRPC ModelStreamInfer with TensorRT-LLM's tensors (`input_ids`,
`request_output_len`, `streaming`, `min_length`) → `output_ids`: the engine model of tessera
(tensorrt_llm) or Triton's Python-backend peer (bench/triton_models/llm_engine).
openai: `POST /v1/completions` with `stream: true` (Server-Sent Events) and `min_tokens`: the
whole pipeline (front-end, Wasm BLS handler with tokenizer and detokenizer, engine).
ensemble: `POST /v2/models/ensemble/generate_stream` with `stream` and `min_length`: TensorRT-LLM's
ensemble (Wasm preprocessing, engine, Wasm postprocessing per engine response).

Each of STREAMS workers sends REQUESTS requests back to back, each a distinct prompt of PROMPT
tokens asking for exactly GENERATED tokens. Metrics as genai-perf defines them: time to first
token (send → first token), inter-token latency (gap between responses ÷ tokens in the later
one), output tokens/s (all tokens ÷ wall time). Server CPU per token is the PID's process
tree's CPU time (Triton runs Python models in stub processes) ÷ tokens. With --long-prompt N,
one extra request with an N-token prompt starts a second into the level, and the row reports
the inter-token latency of the others while it runs. With --metrics (tessera's metrics port),
tokens/s and CPU per token count the tokens the engine generated rather than the text pieces
the client saw (a piece holds whole characters: one token, several, or none for a special one).
Prints one markdown row per level.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import threading
import time

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from stream_load import pct, tree_cpu_seconds


def prompt_ids(n: int, salt: int) -> list[int]:
    """A distinct prompt of n ordinary tokens (ids past the special ones)."""
    return [100 + ((i * 7 + salt * 13) % 20000) for i in range(n)]


class Record:
    """One request: when it was sent, and when each response came with how many tokens."""

    def __init__(self):
        self.sent = time.perf_counter()
        self.arrivals: list[tuple[float, int]] = []

    def tokens(self) -> int:
        return sum(n for _, n in self.arrivals)


def grpc_request(model: str, ids: list[int], generated: int) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=model)
    for name, values, dtype in (("input_ids", ids, "INT32"), ("request_output_len", [generated], "INT32"),
                                ("min_length", [generated], "INT32"), ("streaming", [True], "BOOL")):
        t = req.inputs.add(name=name, datatype=dtype, shape=[1, len(values)])
        if dtype == "BOOL":
            t.contents.bool_contents.extend(values)
        else:
            t.contents.int_contents.extend(values)
    return req


def run_grpc(target: str, model: str, ids: list[int], generated: int, channel) -> Record:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    record = Record()
    for response in stub.ModelStreamInfer(iter([grpc_request(model, ids, generated)])):
        if response.error_message:
            raise RuntimeError(response.error_message)
        now = time.perf_counter()
        out = response.infer_response
        n = 0
        for i, output in enumerate(out.outputs):
            if output.name == "output_ids":
                if out.raw_output_contents:
                    n = len(out.raw_output_contents[i]) // 4
                else:
                    n = len(output.contents.int_contents)
        if n:
            record.arrivals.append((now, n))
        final = out.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            break
        if record.tokens() >= generated:
            break
    return record


def sse_stream(target: str, path: str, body: dict):
    """POSTs `body` and yields each `data:` payload of the Server-Sent Events answer, parsed,
    until `[DONE]` or the end; an error event raises."""
    host, port = target.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:300]!r}")
    try:
        # The response's own readline: it reads the chunked encoding, so the stream ends at
        # the last chunk (generate_stream sends no [DONE]) rather than when the server closes
        # the idle keep-alive connection, seconds later.
        while line := response.readline():
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):]
            if data == b"[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(event["error"])
            yield event
    finally:
        conn.close()


def run_openai(target: str, model: str, text: str, generated: int, _channel) -> Record:
    body = {"model": model, "prompt": text, "max_tokens": generated, "min_tokens": generated,
            "stream": True}
    record = Record()
    for chunk in sse_stream(target, "/v1/completions", body):
        if chunk["choices"] and chunk["choices"][0]["text"]:
            # One streamed piece of text per engine response (a token, or two for a split
            # character): counted as one token here, the usual client-side view.
            record.arrivals.append((time.perf_counter(), 1))
    return record


def run_ensemble(target: str, model: str, text: str, generated: int, _channel) -> Record:
    """TensorRT-LLM's ensemble through generate_stream: each engine response through the Wasm
    postprocessing step, one Server-Sent Event each."""
    body = {"text_input": text, "max_tokens": generated, "min_length": generated, "stream": True}
    record = Record()
    for event in sse_stream(target, f"/v2/models/{model}/generate_stream", body):
        if event.get("text_output"):
            record.arrivals.append((time.perf_counter(), 1))  # as openai: a piece is a token
    return record


def level(args, streams: int, run, prompts) -> dict:
    records: list[Record] = []
    lock = threading.Lock()
    errors: list[str] = []
    long_window: list[float] = []

    def worker(w: int):
        channel = grpc.insecure_channel(args.target) if args.mode == "grpc" else None
        try:
            for r in range(args.requests):
                rec = run(args.target, args.model, prompts(w * 1000 + r, args.prompt),
                          args.generated, channel)
                with lock:
                    records.append(rec)
        except Exception as e:  # noqa: BLE001 - reported in the row
            errors.append(str(e))
        finally:
            if channel is not None:
                channel.close()

    def long_one():
        time.sleep(1.0)
        channel = grpc.insecure_channel(args.target) if args.mode == "grpc" else None
        start = time.perf_counter()
        try:
            run(args.target, args.model, prompts(999_999, args.long_prompt), 4, channel)
        except Exception as e:  # noqa: BLE001
            errors.append(f"long prompt: {e}")
        long_window.extend([start, time.perf_counter()])

    generated0 = engine_tokens(args.metrics)
    cpu0 = tree_cpu_seconds(args.pid)
    outside0 = threads_cpu_ns(args.pid)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(streams)]
    if args.long_prompt:
        threads.append(threading.Thread(target=long_one))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = tree_cpu_seconds(args.pid) - cpu0
    outside1 = threads_cpu_ns(args.pid)
    outside = (sum(t - outside0.get(tid, 0) for tid, t in outside1.items()) / 1e9
               if outside0 is not None and outside1 is not None else float("nan"))
    ttft, itl, itl_during_long = [], [], []
    tokens = 0
    for rec in records:
        tokens += rec.tokens()
        if rec.arrivals:
            ttft.append(rec.arrivals[0][0] - rec.sent)
        for (a, _), (b, n) in zip(rec.arrivals, rec.arrivals[1:]):
            gap = (b - a) / n
            itl.append(gap)
            if long_window and long_window[0] <= b <= long_window[1]:
                itl_during_long.append(gap)
    generated1 = engine_tokens(args.metrics)
    if generated0 is not None and generated1 is not None:
        # The engine's count: a streamed text piece may hold more than one token, or none.
        tokens = generated1 - generated0
    return {
        "streams": streams, "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
        "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99),
        "itl_long_p99": pct(itl_during_long, 99),
        "tokens_per_s": tokens / wall if wall else 0.0,
        "cpu_us_per_token": cpu / tokens * 1e6 if tokens else float("nan"),
        "outside_us_per_token": outside / tokens * 1e6 if tokens else float("nan"),
        "errors": errors,
    }


def engine_tokens(metrics: str | None) -> int | None:
    """Tokens tessera's engines generated so far (`tessera_llm_generation_tokens_total`, all
    models and tenants), from its metrics endpoint HOST:PORT; None without one."""
    if not metrics:
        return None
    host, port = metrics.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("tessera_llm_generation_tokens_total{"))


def threads_cpu_ns(pid: int) -> dict[int, int] | None:
    """CPU time (ns, from schedstat: exact, where clock ticks would charge whole 10 ms ticks to
    whichever thread a tick lands on) of the server's live threads outside the engine: everything
    but the engine thread (named `llm-<model>`) and the workers llama.cpp starts from it (they
    inherit its name). What is left is the serving path: front-ends, batcher, Wasm handlers,
    tokio."""
    times, engine_seen = {}, False
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                on_cpu_ns = int(f.read().split()[0])
        except OSError:
            continue
        if name.startswith("llm-"):
            engine_seen = True
        else:
            times[int(tid)] = on_cpu_ns
    return times if engine_seen else None  # not tessera's engine (Triton): no split


def bare_row(label: str) -> None:
    """A row from llm_bare's JSON report (stdin): llama.cpp's own loop has one TTFT for all."""
    import sys
    r = json.loads(sys.stdin.read())
    ttft = r["ttft_s"] * 1e3
    print(f"| {label} | {r['streams']} | {ttft:.0f} | {ttft:.0f} | {r['itl_p50_ms']:.1f} | "
          f"{r['itl_p99_ms']:.1f} | {r['output_tokens_per_s']:.0f} | - |", flush=True)


def main():
    import sys
    if sys.argv[1:2] == ["bare-row"]:
        bare_row(sys.argv[2])
        return
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["grpc", "openai", "ensemble"])
    p.add_argument("target")
    p.add_argument("pid", type=int)
    p.add_argument("label")
    p.add_argument("model")
    p.add_argument("streams")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--generated", type=int, default=128)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--long-prompt", type=int, default=0)
    p.add_argument("--metrics", help="tessera's metrics HOST:PORT: count tokens as the engine does "
                   "(tokens/s and CPU per token), not as text pieces")
    p.add_argument("--tokenizer", help="tokenizer.json, to make prompt text of --prompt tokens (openai, ensemble)")
    args = p.parse_args()

    if args.mode == "grpc":
        run = run_grpc

        def prompts(salt: int, n: int) -> list[int]:
            return prompt_ids(n, salt)
    else:
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(args.tokenizer)
        run = run_openai if args.mode == "openai" else run_ensemble

        def prompts(salt: int, n: int) -> str:
            # Ordinary tokens decoded to text: about n tokens when the server tokenizes it.
            return tokenizer.decode(prompt_ids(n, salt), skip_special_tokens=True)

    for streams in [int(s) for s in args.streams.split(",")]:
        r = level(args, streams, run, prompts)
        long_note = f" (+{args.long_prompt}-token prompt: ITL p99 {r['itl_long_p99'] * 1e3:.1f} ms)" if args.long_prompt else ""
        err = f" errors: {len(r['errors'])} ({r['errors'][0][:80]})" if r["errors"] else ""
        print(f"| {args.label} | {streams} | {r['ttft_p50'] * 1e3:.0f} | {r['ttft_p99'] * 1e3:.0f} | "
              f"{r['itl_p50'] * 1e3:.1f} | {r['itl_p99'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | "
              f"{r['cpu_us_per_token']:.0f} | {r['outside_us_per_token']:.0f} |{long_note}{err}", flush=True)


if __name__ == "__main__":
    main()
