#!/usr/bin/env python3
"""What tenancy costs per request, and how well a shared model's queue protects a quiet tenant
from a flooding one; one run, side by side.

  overhead   KServe v2 inference on a small Wasm handler (tests/guests/identity_echo) with wrk at
             concurrency 1 and 16 (server pinned to core 1, wrk to core 0): throughput, p99 and
             server CPU per request, for
               open      a server without tenancy (no key checked)
               admin     tenancy on, the admin key (key check only)
               granted   tenancy on, a tenant's key, the operator's model granted to it
                         (key check, name resolution with the grant, quota admission)
               own       tenancy on, a tenant's key, its own deployment of the same component
  neighbour  a shared model with one instance and 20 ms requests (tests/guests/slow_echo): the
             quiet tenant's p99 over sequential requests alone, then while another tenant keeps
             16 requests queued; the ratio (docs/tenants.md states the bound, 5x)

Needs wrk (`apt-get install wrk`). Prints markdown tables; stdlib only.

    SKIP_BUILD=1 bench/tenants.py
    DURATION=10 QUIET_REQUESTS=100 bench/tenants.py
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from functions_vs_wasmtime import free_port, log, stop, wait_ok, wrk  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests/fixtures/model_repository"
ADMIN_KEY = "bench-admin-key-0123456789"
CONCS = [int(c) for c in os.environ.get("CONCS", "1,16").split(",")]
QUIET_REQUESTS = int(os.environ.get("QUIET_REQUESTS", "100"))
BODY = json.dumps({"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]})


def call(port: int, method: str, path: str, key: str | None, body: dict | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        c.request(method, path, json.dumps(body) if body is not None else None, headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def ok(answer, what: str) -> bytes:
    status, body = answer
    if status not in (200, 201):
        sys.exit(f"{what}: {status} {body[:300]!r}")
    return body


def deploy(port: int, key: str | None, name: str, fixture: str, instances: int = 2) -> None:
    config = {
        "name": name, "backend": "wasm", "max_batch_size": 8,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
    }
    wasm = base64.b64encode((FIXTURES / fixture / "1/model.wasm").read_bytes()).decode()
    ok(call(port, "POST", f"/v2/repository/models/{name}/load", key,
            {"parameters": {"config": json.dumps(config), "file:1/model.wasm": wasm}}),
       f"deploy {name}")


def tenant(port: int, name: str, grants: list[str]) -> str:
    ok(call(port, "POST", "/v1/tenants", ADMIN_KEY, {"name": name}), f"create {name}")
    # The bench measures the path, not the default quotas.
    ok(call(port, "PUT", f"/v1/tenants/{name}/quotas", ADMIN_KEY,
            {"requests_per_second": 0, "max_concurrent_requests": 100000}), "quotas")
    for model in grants:
        ok(call(port, "POST", f"/v1/tenants/{name}/grants/{model}", ADMIN_KEY), "grant")
    answer = ok(call(port, "POST", f"/v1/tenants/{name}/keys", ADMIN_KEY), "key")
    return json.loads(answer)["key"]


def start(binary: Path, scratch: Path, port: int, tenancy: bool) -> subprocess.Popen:
    tag = "tenancy" if tenancy else "open"
    args = [str(binary), "--model-repository", str(scratch / "repo"),
            "--store", str(scratch / f"store-{tag}"), "--wasm-cache-dir", str(scratch / "cache"),
            "--http-address", "127.0.0.1", "--http-port", str(port),
            "--metrics-port", str(free_port()), "--allow-grpc", "false",
            "--max-inflight-requests", "100000"]
    if tenancy:
        key_file = scratch / "admin.key"
        key_file.write_text(ADMIN_KEY)
        args += ["--admin-key-file", str(key_file)]
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DYLIB_PATH", "TESSERA_ADMIN_KEY")}
    env["RUST_LOG"] = "warn"
    p = subprocess.Popen(["taskset", "-c", "1", *args], stdout=subprocess.DEVNULL,
                         stderr=open(scratch / f"tessera-{tag}.log", "ab"), env=env)
    wait_ok(port, "/v2/health/live")
    return p


def overhead(port: int, pid: int, scratch: Path, label: str, model: str, key: str | None,
             rows: list) -> None:
    script = scratch / "post.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(BODY)}\n'
                      'wrk.headers["Content-Type"] = "application/json"\n')
    extra = ["-s", str(script)]
    if key:
        extra += ["-H", f"Authorization: Bearer {key}"]
    url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    for conc in CONCS:
        log(f"{label}: c{conc}")
        r = wrk(url, conc, pid, extra)
        if r["errors"]:
            sys.exit(f"{label} c{conc}: {r['errors']} failed requests")
        rows.append((label, conc, r))


def p99_sequential(port: int, key: str, n: int) -> float:
    body = json.loads(BODY)
    body["parameters"] = {"delay_ms": 20}
    times = []
    for _ in range(n):
        started = time.perf_counter()
        ok(call(port, "POST", "/v2/models/slow/infer", key, body), "quiet request")
        times.append(time.perf_counter() - started)
    times.sort()
    return times[min(len(times) - 1, len(times) * 99 // 100)] * 1000


def neighbour(port: int) -> tuple[float, float]:
    deploy(port, ADMIN_KEY, "slow", "slow_echo", instances=1)
    noisy = tenant(port, "noisy", ["slow"])
    quiet = tenant(port, "quiet", ["slow"])
    alone = p99_sequential(port, quiet, QUIET_REQUESTS)
    stop_flag = threading.Event()

    def flood() -> None:
        body = json.loads(BODY)
        body["parameters"] = {"delay_ms": 20}
        while not stop_flag.is_set():
            call(port, "POST", "/v2/models/slow/infer", noisy, body)

    threads = [threading.Thread(target=flood) for _ in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    flooded = p99_sequential(port, quiet, QUIET_REQUESTS)
    stop_flag.set()
    for t in threads:
        t.join()
    return alone, flooded


def main() -> None:
    if not shutil.which("wrk"):
        log("installing wrk")
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=True, capture_output=True)
    if not os.environ.get("SKIP_BUILD"):
        subprocess.run(["cargo", "build", "--release", "-p", "tessera"], cwd=ROOT, check=True)
    binary = Path(os.environ.get("TESSERA_BIN", ROOT / "target/release/tessera"))
    rows: list = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-tenants-") as tmp:
        scratch = Path(tmp)
        (scratch / "repo").mkdir()
        port = free_port()
        server = start(binary, scratch, port, tenancy=False)
        try:
            deploy(port, None, "echo", "identity_echo")
            overhead(port, server.pid, scratch, "open", "echo", None, rows)
        finally:
            stop(server)
        port = free_port()
        server = start(binary, scratch, port, tenancy=True)
        try:
            deploy(port, ADMIN_KEY, "echo", "identity_echo")
            acme = tenant(port, "acme", ["echo"])
            deploy(port, acme, "mine", "identity_echo")
            overhead(port, server.pid, scratch, "admin", "echo", ADMIN_KEY, rows)
            overhead(port, server.pid, scratch, "granted", "echo", acme, rows)
            overhead(port, server.pid, scratch, "own", "mine", acme, rows)
            alone, flooded = neighbour(port)
        finally:
            stop(server)

    base = {conc: r for label, conc, r in rows if label == "open"}
    print("| caller | conc | req/s | p99 ms | server CPU µs/req | CPU vs open |")
    print("|---|---|---|---|---|---|")
    for label, conc, r in rows:
        ratio = r["cpu_us"] / base[conc]["cpu_us"] if base.get(conc) else float("nan")
        print(f"| {label} | {conc} | {r['rps']:.0f} | {r['p99']:.2f} | {r['cpu_us']:.1f} | {ratio:.2f}x |")
    print()
    print("| quiet tenant, 20 ms requests, one instance | p99 ms |")
    print("|---|---|")
    print(f"| alone | {alone:.1f} |")
    print(f"| another tenant keeping 16 requests queued | {flooded:.1f} |")
    print(f"| ratio (bound: 5x) | {flooded / alone:.2f}x |")


if __name__ == "__main__":
    main()
