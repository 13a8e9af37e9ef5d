#!/usr/bin/env python3
"""Functions on tessera against `wasmtime serve` (the CLI of the same wasmtime, 48.0.8), with the
same component (functions/hello, built for plain wasi:http) and the same load generator (wrk),
side by side in one run:

  throughput, p50 and p99 at concurrency 1 and 16, and server CPU per request
      (servers pinned to core 1, wrk to core 0; /proc utime+stime of the server process)
  cold start: deploy -> first response with a warm compile cache, and first response after a
      restart with a warm cache (process start -> first 200)
  memory: tessera's RSS with 1,000 distinct functions deployed

Needs wrk (`apt-get install wrk`) and wasmtime 48.0.8 (`cargo install wasmtime-cli --version
48.0.8 --locked --root target/bench-tools`; the script does both when they are missing).

    SKIP_BUILD=1 bench/functions_vs_wasmtime.py
    DURATION=10 FUNCTIONS=1000 bench/functions_vs_wasmtime.py
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "functions/hello/function.wasm"
TOOLS = ROOT / "target/bench-tools"
WASMTIME = Path(os.environ.get("WASMTIME_BIN", TOOLS / "bin/wasmtime"))
DURATION = int(os.environ.get("DURATION", "10"))
FUNCTIONS = int(os.environ.get("FUNCTIONS", "1000"))
CONCS = [int(c) for c in os.environ.get("CONCS", "1,16").split(",")]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body: bytes | None = None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body, {"Content-Type": "application/json"} if body else {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_ok(port: int, path: str, limit_s: float = 120) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        try:
            if request(port, "GET", path, timeout=2)[0] == 200:
                return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(0.002)
    sys.exit(f"no 200 from :{port}{path} in {limit_s} s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wrk(url: str, connections: int, pid: int, extra: list[str] | None = None) -> dict:
    """wrk on core 0 against `url` (`extra`: more wrk arguments, e.g. a script or headers)."""
    before = cpu_seconds(pid)
    out = subprocess.run(
        ["taskset", "-c", "0", "wrk", "-t1", f"-c{connections}", f"-d{DURATION}s", "--latency",
         *(extra or []), url],
        capture_output=True, text=True, check=True).stdout
    cpu = cpu_seconds(pid) - before

    def ms(label: str) -> float:
        m = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)", out, re.M)
        if not m:
            return float("nan")
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    total = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": total / DURATION, "p50": ms("50"), "p99": ms("99"),
            "cpu_us": cpu / max(total, 1) * 1e6, "errors": int(errors.group(1)) if errors else 0}


def ensure_tools() -> None:
    if not shutil.which("wrk"):
        log("installing wrk")
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=True, capture_output=True)
    if not WASMTIME.exists():
        log("building wasmtime-cli 48.0.8 (several minutes)")
        subprocess.run(["cargo", "install", "wasmtime-cli", "--version", "48.0.8", "--locked",
                        "--root", str(TOOLS)], check=True)


def start_tessera(binary: Path, scratch: Path, port: int, functions: Path | None) -> subprocess.Popen:
    args = [str(binary), "--model-repository", str(scratch / "repo"), "--store", str(scratch / "store"),
            "--wasm-cache-dir", str(scratch / "cache"), "--http-address", "127.0.0.1",
            "--http-port", str(port), "--metrics-port", str(free_port()), "--allow-grpc", "false",
            "--max-inflight-requests", "100000"]
    if functions:
        args += ["--functions", str(functions)]
    env = {k: v for k, v in os.environ.items() if k != "ORT_DYLIB_PATH"}
    env["RUST_LOG"] = "warn"
    return subprocess.Popen(["taskset", "-c", "1", *args], stdout=subprocess.DEVNULL,
                            stderr=open(scratch / f"tessera-{port}.log", "ab"), env=env)


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def deploy(port: int, name: str, component_b64: str) -> None:
    body = json.dumps({"parameters": {"file:function.wasm": component_b64}}).encode()
    status, answer = request(port, "POST", f"/v2/repository/functions/{name}/load", body)
    if status != 200:
        sys.exit(f"deploy {name}: {status} {answer[:300]!r}")


def main() -> None:
    binary = Path(os.environ.get("TESSERA_BIN", ROOT / "target/release/tessera"))
    if not os.environ.get("SKIP_BUILD"):
        subprocess.run(["cargo", "build", "--release", "--bin", "tessera"], cwd=ROOT, check=True)
    ensure_tools()
    scratch = Path(tempfile.mkdtemp(prefix="tessera-fn-bench-"))
    (scratch / "repo").mkdir()
    # The same component, without a manifest: tessera's defaults (no GREETING set).
    (scratch / "functions/hello").mkdir(parents=True)
    shutil.copy(HELLO, scratch / "functions/hello/function.wasm")
    rows, extra = [], {}
    try:
        port = free_port()
        tessera = start_tessera(binary, scratch, port, scratch / "functions")
        wait_ok(port, "/v1/functions/hello/")
        wport = free_port()
        env = {k: v for k, v in os.environ.items()}
        wasmtime = subprocess.Popen(
            ["taskset", "-c", "1", str(WASMTIME), "serve", "-Scli", "--addr", f"127.0.0.1:{wport}",
             str(HELLO)], stdout=subprocess.DEVNULL, stderr=open(scratch / "wasmtime.log", "wb"), env=env)
        wait_ok(wport, "/")
        for c in CONCS:
            for label, url, pid in (("tessera", f"http://127.0.0.1:{port}/v1/functions/hello/", tessera.pid),
                                    ("wasmtime serve", f"http://127.0.0.1:{wport}/", wasmtime.pid)):
                log(f"wrk {label} c{c}")
                rows.append((label, c, wrk(url, c, pid)))
        stop(wasmtime)

        # Cold start with a warm compile cache: deploy -> first response.
        component = base64.b64encode(HELLO.read_bytes()).decode()
        deploy(port, "warmup", component)  # puts the component in the cache
        starts = []
        for i in range(10):
            t = time.perf_counter()
            deploy(port, f"cold{i}", component)
            wait_ok(port, f"/v1/functions/cold{i}/")
            starts.append((time.perf_counter() - t) * 1000)
        extra["deploy_ms"] = sorted(starts)[len(starts) // 2]

        # 1,000 distinct functions deployed: RSS.
        rss_before = rss_mib(tessera.pid)
        t = time.perf_counter()
        for i in range(FUNCTIONS):
            deploy(port, f"fn{i:04}", component)
        extra["deploy_all_s"] = time.perf_counter() - t
        for i in (0, FUNCTIONS // 2, FUNCTIONS - 1):
            wait_ok(port, f"/v1/functions/fn{i:04}/")
        extra["rss_before"], extra["rss_after"] = rss_before, rss_mib(tessera.pid)
        stop(tessera)

        # First response after a restart, warm cache, with every deployment loading at start.
        t = time.perf_counter()
        tessera = start_tessera(binary, scratch, port, scratch / "functions")
        extra["restart_ms"] = wait_ok(port, "/v1/functions/cold0/") * 1000
        stop(tessera)
        # And with only the one function (the store emptied).
        shutil.rmtree(scratch / "store")
        t = time.perf_counter()
        tessera = start_tessera(binary, scratch, port, scratch / "functions")
        extra["restart_one_ms"] = wait_ok(port, "/v1/functions/hello/") * 1000
        stop(tessera)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"functions/hello ({HELLO.stat().st_size // 1024} KiB, plain wasi:http), wrk -t1 {DURATION} s, "
          f"server on core 1, wrk on core 0\n")
    print("| server | conc | req/s | p50 ms | p99 ms | server CPU µs/req | non-2xx |")
    print("|---|---|---|---|---|---|---|")
    for label, c, r in rows:
        print(f"| {label} | {c} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
              f"{r['cpu_us']:.0f} | {r['errors']} |")
    print()
    for c in CONCS:
        t = next(r for l, cc, r in rows if l == "tessera" and cc == c)
        w = next(r for l, cc, r in rows if l != "tessera" and cc == c)
        print(f"c{c}: tessera/wasmtime throughput {t['rps'] / w['rps']:.2f}x, "
              f"p99 {t['p99'] / w['p99']:.2f}x, CPU/req {t['cpu_us'] / w['cpu_us']:.2f}x")
    print(f"\ndeploy -> first response, warm cache (median of 10): {extra['deploy_ms']:.1f} ms")
    print(f"restart -> first response, warm cache: {extra['restart_one_ms']:.0f} ms with one function, "
          f"{extra['restart_ms']:.0f} ms with {FUNCTIONS + 11} deployed functions loading at start")
    print(f"{FUNCTIONS} functions deployed in {extra['deploy_all_s']:.1f} s; RSS "
          f"{extra['rss_before']:.0f} MiB before, {extra['rss_after']:.0f} MiB after")


if __name__ == "__main__":
    main()
