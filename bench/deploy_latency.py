#!/usr/bin/env python3
"""Deployment timings of a small Wasm handler (tests/guests/identity_echo, ~115 KB) on tessera:

  cold   deploy-to-first-response with an empty compile cache (the component is compiled)
  warm   deploy-to-first-response with the component in the compile cache
  swap   a new revision of a model under load (8 clients in a loop): the deploy call's time,
         failed requests, and the clients' p99 during the swaps against p99 without them

Deploy-to-first-response: from sending Triton's `load` with `config` and `file:1/model.wasm` to
the first successful answer of the model. Prints a markdown table; stdlib only.

    SKIP_BUILD=1 bench/deploy_latency.py            # target/release/tessera as it is
    TESSERA_BIN=... ROUNDS=20 bench/deploy_latency.py
"""
from __future__ import annotations

import base64
import http.client
import json
import os
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
COMPONENT = ROOT / "tests/fixtures/model_repository/identity_echo/1/model.wasm"
ROUNDS = int(os.environ.get("ROUNDS", "10"))
CLIENTS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    def __init__(self, port: int):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        self.c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = self.c.getresponse()
        return r.status, r.read()


def config(name: str, offset: int) -> str:
    return json.dumps({
        "name": name, "backend": "wasm", "max_batch_size": 8,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "parameters": {"offset": {"string_value": str(offset)}},
    })


WASM_B64 = base64.b64encode(COMPONENT.read_bytes()).decode()
INFER = {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}


def deploy(conn: Conn, name: str, offset: int) -> None:
    status, body = conn.post(f"/v2/repository/models/{name}/load", {"parameters": {
        "config": config(name, offset), "file:1/model.wasm": WASM_B64}})
    if status != 200:
        sys.exit(f"deploy {name} failed: {status} {body[:300]!r}")


def deploy_to_first_response(conn: Conn, name: str) -> float:
    start = time.perf_counter()
    deploy(conn, name, 1)
    while conn.post(f"/v2/models/{name}/infer", INFER)[0] != 200:
        pass
    return (time.perf_counter() - start) * 1000


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    binary = Path(os.environ.get("TESSERA_BIN", ROOT / "target/release/tessera"))
    if not os.environ.get("SKIP_BUILD"):
        subprocess.run(["cargo", "build", "--release", "--bin", "tessera"], cwd=ROOT, check=True)
    scratch = Path(tempfile.mkdtemp(prefix="tessera-deploy-bench-"))
    repo, store, cache = scratch / "repo", scratch / "store", scratch / "cache"
    repo.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ORT_DYLIB_PATH"}
    server = subprocess.Popen(
        [str(binary), "--model-repository", str(repo), "--store", str(store),
         "--wasm-cache-dir", str(cache), "--http-address", "127.0.0.1",
         "--http-port", str(port), "--metrics-port", str(free_port()), "--allow-grpc", "false"],
        stdout=subprocess.DEVNULL, stderr=open(scratch / "server.log", "wb"), env=env)
    try:
        for _ in range(300):
            try:
                if Conn(port).post("/v2/repository/index", {})[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        conn = Conn(port)
        cold, warm = [], []
        for i in range(ROUNDS):
            for f in cache.glob("*"):
                f.unlink()
            cold.append(deploy_to_first_response(conn, f"cold{i}"))
        for i in range(ROUNDS):
            warm.append(deploy_to_first_response(conn, f"warm{i}"))

        deploy(conn, "swap", 0)
        stop, errors, latencies = threading.Event(), [], {"quiet": [], "swapping": []}
        phase = ["quiet"]

        def client() -> None:
            c = Conn(port)
            while not stop.is_set():
                t = time.perf_counter()
                status, body = c.post("/v2/models/swap/infer", INFER)
                latencies[phase[0]].append((time.perf_counter() - t) * 1000)
                if status != 200:
                    errors.append((status, body[:200]))

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(2)
        phase[0] = "swapping"
        swaps = []
        for i in range(ROUNDS):
            start = time.perf_counter()
            deploy(conn, "swap", i + 1)
            swaps.append((time.perf_counter() - start) * 1000)
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"Deployments of identity_echo ({COMPONENT.stat().st_size // 1024} KiB), {ROUNDS} each; "
          f"{os.cpu_count()} cores\n")
    print("| case | median ms | p90 ms | max ms |")
    print("|---|---|---|---|")
    for label, values in (("deploy to first response, cold cache", cold),
                          ("deploy to first response, warm cache", warm),
                          (f"swap a revision under load ({CLIENTS} clients)", swaps)):
        print(f"| {label} | {statistics.median(values):.1f} | {pct(values, 90):.1f} "
              f"| {max(values):.1f} |")
    q, s = latencies["quiet"], latencies["swapping"]
    print(f"\nUnder load: {len(q) + len(s)} requests, {len(errors)} failed; client p99 "
          f"{pct(q, 99):.2f} ms without swaps, {pct(s, 99):.2f} ms while swapping.")
    if errors:
        print(f"first errors: {errors[:3]}")
        sys.exit(1)


if __name__ == "__main__":
    main()
