#!/usr/bin/env python3
"""Deploy-to-served-everywhere across replicas on one shared store, and what the shared store
costs a deploy, side by side in one run:

  local   one server, --store DIR (no replicas): the deploy call's time
  file    3 replicas, --store file://DIR (a shared directory)
  s3      3 replicas, --store s3://… on moto's S3 server on loopback

For each, ROUNDS deploys of a small ONNX model (add_sub, alternating max_batch_size) to the
first replica: the deploy call's time (until it is acknowledged: durable in the store and
serving there), and from the acknowledgement until every replica serves the new revision
(polled every 10 ms), with each deploy at a random point of the polling period. Then the
steady-state cost of watching the store: LOAD_SECONDS of inference at 8 concurrent clients on
the first replica, its throughput, p99 and server CPU per inference, against the single server
on its own store. Prints markdown tables. Not run in CI.

    .venv/bin/python bench/replicas.py [--bin target/release/tessera] [--rounds 20]
        [--poll-ms 1000]
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from stream_load import tree_cpu_seconds  # noqa: E402
ONNX = (ROOT / "model_repository/add_sub/1/model.onnx").read_bytes()
BUCKET = "tessera-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body: dict | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request(method, path, json.dumps(body) if body is not None else None,
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def start(binary: str, store: str, cache: Path | None, env: dict, poll_ms: int, repo: Path,
          logs: Path):
    port = free_port()
    args = [binary, "--model-repository", str(repo), "--model-control-mode", "explicit",
            "--store", store, "--http-port", str(port), "--grpc-port", str(free_port()),
            "--metrics-port", str(free_port()), "--http-address", "127.0.0.1",
            "--grpc-address", "127.0.0.1"]
    if cache is not None:
        args += ["--store-cache", str(cache), "--store-poll-ms", str(poll_ms)]
    log = open(logs / f"server-{port}.log", "wb")
    proc = subprocess.Popen(args, env={**os.environ, **env}, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if request(port, "GET", "/v2/health/ready")[0] == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"a replica did not start: see {log.name}")


def config(name: str, size: int) -> str:
    return json.dumps({
        "name": name, "platform": "onnxruntime_onnx", "max_batch_size": size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                   {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
    })


def batch_size(port: int, name: str):
    status, body = request(port, "GET", f"/v2/models/{name}/config")
    return json.loads(body)["max_batch_size"] if status == 200 else None


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def measure(ports: list[int], rounds: int, poll_ms: int) -> tuple[list[float], list[float]]:
    acks, everywhere = [], []
    rng = random.Random(7)
    for i in range(rounds):
        # A deploy lands at a random point of the replicas' polling period, as in real use
        # (deploying right after the last convergence would always wait a whole period).
        time.sleep(rng.uniform(0, poll_ms / 1000))
        size = 2 + i % 2 * 2
        body = {"parameters": {"config": config("m", size),
                               "file:1/model.onnx": base64.b64encode(ONNX).decode()}}
        t0 = time.monotonic()
        status, text = request(ports[0], "POST", "/v2/repository/models/m/load", body)
        acked = time.monotonic()
        if status != 200:
            raise SystemExit(f"deploy failed: {status} {text[:300]!r}")
        while not all(batch_size(p, "m") == size for p in ports[1:]):
            if time.monotonic() - acked > 30:
                raise SystemExit("a replica did not converge within 30 s")
            time.sleep(0.01)
        acks.append((acked - t0) * 1000)
        everywhere.append((time.monotonic() - acked) * 1000)
    return acks, everywhere


INFER = json.dumps({"inputs": [
    {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
    for n in ("INPUT0", "INPUT1")]})


def steady_load(port: int, pid: int, seconds: float, clients: int = 8):
    """(inferences per second, p99 ms, server CPU µs per inference) of a closed loop."""
    latencies: list[float] = []
    stop_at = time.monotonic() + seconds

    def client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            c.request("POST", "/v2/models/m/infer", INFER, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit(f"inference failed: {r.status}")
            mine.append((time.monotonic() - t0) * 1000)
        latencies.extend(mine)

    cpu0 = tree_cpu_seconds(pid)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    cpu = tree_cpu_seconds(pid) - cpu0
    return len(latencies) / elapsed, pct(latencies, 99), cpu / len(latencies) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default=str(ROOT / "target/release/tessera"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--poll-ms", type=int, default=1000)
    parser.add_argument("--load-seconds", type=float, default=10.0)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tessera-bench-replicas-"))
    repo = scratch / "repository"
    repo.mkdir()
    moto_port = free_port()
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1",
                             "-p", str(moto_port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    procs = []
    rows, loads = [], []
    try:
        wait_port(moto_port)
        import boto3
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}", region_name="us-east-1",
                     aws_access_key_id="test", aws_secret_access_key="test").create_bucket(
                         Bucket=BUCKET)
        s3_env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                  "AWS_REGION": "us-east-1", "AWS_ENDPOINT": f"http://127.0.0.1:{moto_port}",
                  "AWS_ALLOW_HTTP": "true"}
        kinds = [("local dir, 1 server", str(scratch / "local"), {}, 1, False),
                 ("file://, 3 replicas", (scratch / "shared").as_uri(), {}, 3, True),
                 ("s3:// (moto), 3 replicas", f"s3://{BUCKET}/bench", s3_env, 3, True),
                 # Watching alone, without two more servers on the same cores.
                 ("s3:// (moto), 1 replica", f"s3://{BUCKET}/bench1", s3_env, 1, True),
                 ("local dir, 1 server (again)", str(scratch / "local2"), {}, 1, False)]
        for label, store, env, count, shared in kinds:
            ports = []
            for n in range(count):
                cache = scratch / f"cache-{label[:4]}-{n}" if shared else None
                proc, port = start(args.bin, store, cache, env, args.poll_ms, repo, scratch)
                procs.append(proc)
                ports.append(port)
            acks, everywhere = measure(ports, args.rounds, args.poll_ms)
            rows.append((label, acks, everywhere if count > 1 else None))
            if args.load_seconds > 0:
                steady_load(ports[0], procs[0].pid, 1.0)  # warm-up
                loads.append((label, *steady_load(ports[0], procs[0].pid, args.load_seconds)))
            for proc in procs:
                proc.terminate()
                proc.wait()
            procs.clear()
    finally:
        for proc in procs:
            proc.kill()
        moto.kill()
        moto.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{args.rounds} deploys each, --store-poll-ms {args.poll_ms}\n")
    print("| store | deploy acknowledged, median | p99 | then served on every replica, median | p99 |")
    print("|---|---:|---:|---:|---:|")
    for label, acks, everywhere in rows:
        spread = (f"{statistics.median(everywhere):.0f} ms | {pct(everywhere, 99):.0f} ms"
                  if everywhere else "– | –")
        print(f"| {label} | {statistics.median(acks):.0f} ms | {pct(acks, 99):.0f} ms | {spread} |")
    if loads:
        print(f"\nSteady state on the first replica, 8 clients, {args.load_seconds:.0f} s each\n")
        print("| store | inferences/s | p99 | server CPU per inference |")
        print("|---|---:|---:|---:|")
        for label, rate, p99, cpu in loads:
            print(f"| {label} | {rate:.0f} | {p99:.1f} ms | {cpu:.0f} µs |")


if __name__ == "__main__":
    main()
