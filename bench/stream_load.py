#!/usr/bin/env python3
"""Load for decoupled and stateful models over gRPC, the same for any KServe v2 server
(tessera or Triton), from one process (grpcio, one channel per stream).

    stream_load.py repeat HOST:PORT PID LABEL STREAMS,... [--responses 1000] [--seconds 5]
    stream_load.py sequence HOST:PORT PID LABEL CONCURRENCY,... [--model M] [--length 100]

repeat: each of STREAMS gRPC streams sends a `repeat_int32` request (IN = 0..N-1, DELAY = 0,
WAIT = 0), reads its N responses, and sends the next, for SECONDS. Reports responses/s, the
gap between consecutive responses of a request (p50, p99) and the server's CPU per response.

sequence: each of CONCURRENCY clients runs sequences of LENGTH steps (unary ModelInfer with
sequence_id / sequence_start / sequence_end; INPUT INT64 [1, 1]) back to back. Reports steps/s,
latency p50/p99 and the server's CPU per step.

Server CPU is the PID's process tree (Triton's Python backend runs models in stub processes),
from /proc. Prints one markdown row per level.
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    parents, ticks = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = int(fields[11]) + int(fields[12])
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(ticks.get(pid, 0) for pid in tree) / TICK


def pct(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def repeat_request(n: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="repeat_int32")
    for name, datatype, shape, values in (("IN", "INT32", [n], np.arange(n, dtype=np.int32)),
                                          ("DELAY", "UINT32", [n], np.zeros(n, np.uint32)),
                                          ("WAIT", "UINT32", [1], np.zeros(1, np.uint32))):
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(values.tobytes())
    request.outputs.add(name="OUT")
    return request


def run_repeat(target, streams, responses, seconds):
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    counts, gaps = [0], []

    def one_stream():
        channel = grpc.insecure_channel(target)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = repeat_request(responses)
        ready = threading.Semaphore(1)
        running = [True]

        def requests():
            while True:
                ready.acquire()
                if not running[0] or time.monotonic() > stop_at:
                    return
                yield request

        local_gaps, local_count, seen, last = [], 0, 0, None
        try:
            for answer in stub.ModelStreamInfer(requests()):
                if answer.error_message:
                    raise RuntimeError(answer.error_message)
                now = time.perf_counter_ns()
                if last is not None and seen > 0:
                    local_gaps.append((now - last) / 1000)
                last, seen, local_count = now, seen + 1, local_count + 1
                if seen == responses:
                    seen, last = 0, None
                    ready.release()
        finally:
            running[0] = False
            channel.close()
        with lock:
            counts[0] += local_count
            gaps.extend(local_gaps)

    threads = [threading.Thread(target=one_stream) for _ in range(streams)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts[0], time.monotonic() - started, gaps


def sum_request(model, sequence_id, value, start, end):
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT", datatype="INT64", shape=[1, 1])
    request.raw_input_contents.append(np.array([[value]], np.int64).tobytes())
    request.outputs.add(name="SUM")
    request.parameters["sequence_id"].int64_param = sequence_id
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    return request


def run_sequences(target, clients, model, length, seconds):
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    steps, latencies = [0], []

    def one_client(k):
        channel = grpc.insecure_channel(target)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        local, count, sequence = [], 0, 0
        while time.monotonic() < stop_at:
            sequence += 1
            sequence_id = 1 + k * 1_000_000 + sequence
            total = 0
            for step in range(length):
                total += step
                t0 = time.perf_counter_ns()
                answer = stub.ModelInfer(sum_request(model, sequence_id, step, step == 0,
                                                     step == length - 1))
                local.append((time.perf_counter_ns() - t0) / 1000)
                got = int(np.frombuffer(answer.raw_output_contents[0], np.int64)[0])
                if got != total:
                    raise RuntimeError(f"sequence {sequence_id} step {step}: {got} != {total}")
                count += 1
        channel.close()
        with lock:
            steps[0] += count
            latencies.extend(local)

    threads = [threading.Thread(target=one_client, args=(k,)) for k in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return steps[0], time.monotonic() - started, latencies


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["repeat", "sequence"])
    ap.add_argument("target")
    ap.add_argument("pid", type=int)
    ap.add_argument("label")
    ap.add_argument("levels")
    ap.add_argument("--responses", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--model", default="sequence_sum")
    ap.add_argument("--length", type=int, default=100)
    args = ap.parse_args()
    for level in (int(x) for x in args.levels.split(",")):
        cpu0 = tree_cpu_seconds(args.pid)
        if args.mode == "repeat":
            count, elapsed, gaps = run_repeat(args.target, level, args.responses, args.seconds)
        else:
            count, elapsed, gaps = run_sequences(args.target, level, args.model, args.length,
                                                 args.seconds)
        cpu = tree_cpu_seconds(args.pid) - cpu0
        print(f"| {args.label} | {args.mode} | {level} | {count / elapsed:,.0f} | "
              f"{pct(gaps, 50):,.0f} | {pct(gaps, 99):,.0f} | {cpu / elapsed * 100:.0f} | "
              f"{cpu / max(count, 1) * 1e6:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
