#!/usr/bin/env python3
"""Triton's add_sub as a Python model.py and as a JavaScript handler (both built by `tessera
build`), as a Rust handler and as an ONNX model, side by side in one server: throughput, p50/p99 latency and server CPU per
inference over HTTP at each concurrency, and the guest's own time per execution from the
server's metrics; then each model's file size, load time with a cold and a warm compiled-code
cache, and the memory a loaded instance takes. Not run in CI.

    .venv/bin/python bench/python_models.py [--bin target/release/tessera] [--seconds 5]
        [--concurrency 1,16] [--footprint-only]

It builds a scratch repository (examples/triton-python's add_sub, examples/js/add_sub_js and
the Rust example handler at the same FP32 [4] contract), starts the server on free ports, and removes both at the end.

With `--componentize-js PATH` (the CLI of `npm install @bytecodealliance/componentize-js`, 385 MB
of node_modules, so neither in CI nor in `tessera build`), it also builds
bench/spidermonkey/add_sub_sm, the same handler on SpiderMonkey (written against the WIT
bindings directly: the Tessera JS SDK is packaged for componentize-qjs). Not its `--aot` build:
that downloads weval from GitHub, which this machine cannot reach.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from stream_load import tree_cpu_seconds  # noqa: E402

RUST_CONFIG = """name: "add_sub_rust"
backend: "wasm"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
MODELS = [("add_sub", "Python model.py (Triton's, unchanged)"),
          ("add_sub_rust", "Rust handler"),
          ("add_sub_js", "JavaScript (QuickJS)"),
          ("pytorch", "ONNX Runtime")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(metrics_port: int, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def start_server(binary: str, repo: Path, work: Path, cache: Path, *extra: str):
    """The server on free ports; returns once it is ready."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = work / "server.log"
    proc = subprocess.Popen([binary, "--model-repository", str(repo), "--store", str(work / "store"),
                             "--http-port", str(http), "--grpc-port", str(grpc),
                             "--metrics-port", str(metrics), "--http-address", "127.0.0.1",
                             "--grpc-address", "127.0.0.1", "--wasm-cache-dir", str(cache), *extra],
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    t0 = time.perf_counter()
    url = f"127.0.0.1:{http}"
    while True:
        try:
            if urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2).status == 200:
                return proc, url, metrics
        except OSError:
            pass
        if proc.poll() is not None or time.perf_counter() - t0 > 300:
            proc.kill()
            sys.exit(f"server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def with_instances(model_dir: Path, count: int):
    config = model_dir / "config.pbtxt"
    text = re.sub(r"instance_group\s*\[[^\]]*\]\s*", "", config.read_text())
    config.write_text(text + f"\ninstance_group [ {{ count: {count} kind: KIND_CPU }} ]\n")


def footprint(binary: str, repo: Path, work: Path):
    """Per model: its file's size, the load with an empty compiled-code cache (cold compile) and
    with a warm one, and the memory one instance adds. Each load runs in a server of its own
    (explicit model control, nothing else loaded), so the resident-set differences are the
    model's: memory an unload frees is not always given back to the system."""
    cache = work / "cache-footprint"
    print("| model | file MB | cold load s | cached load s | RSS after a cold load MB | "
          "RSS, cached load, 1 instance MB | RSS per further instance MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model, what in MODELS:
        version = repo / model / "1"
        artifact = next(p for p in (version / "model.wasm", version / "model.onnx") if p.exists())
        loads, rss = [], {}
        for phase, count in (("cold", 1), ("cached", 1), ("cached", 5)):
            with_instances(repo / model, count)
            proc, url, _ = start_server(binary, repo, work, cache, "--model-control-mode", "explicit")
            try:
                base = rss_bytes(proc.pid)
                t0 = time.perf_counter()
                req = urllib.request.Request(f"http://{url}/v2/repository/models/{model}/load",
                                             data=b"{}", method="POST")
                urllib.request.urlopen(req, timeout=300).read()
                if count == 1:
                    loads.append(time.perf_counter() - t0)
                load(url, model, count, 0.5)  # every instance touched
                rss[(phase, count)] = rss_bytes(proc.pid) - base
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        with_instances(repo / model, 1)
        per_instance = (rss[("cached", 5)] - rss[("cached", 1)]) / 4
        print(f"| {model} ({what}) | {artifact.stat().st_size / 1e6:.1f} | {loads[0]:.2f} | "
              f"{loads[1]:.2f} | {rss[('cold', 1)] / 1e6:.0f} | {rss[('cached', 1)] / 1e6:.0f} | "
              f"{per_instance / 1e6:.1f} |",
              flush=True)


def build_spidermonkey(cli: str, repo: Path) -> None:
    """add_sub on SpiderMonkey, added to MODELS."""
    model = "add_sub_sm"
    shutil.copytree(ROOT / "bench" / "spidermonkey" / model, repo / model,
                    ignore=shutil.ignore_patterns("model.wasm"))
    version = repo / model / "1"
    t0 = time.perf_counter()
    subprocess.run(["node", cli, str(version / "model.js"), "--wit", str(ROOT / "wit"),
                    "--world-name", "model", "-d", "http", "fetch-event",
                    "-o", str(version / "model.wasm")], check=True, stdout=subprocess.DEVNULL)
    print(f"componentize-js {model}: {time.perf_counter() - t0:.1f} s", flush=True)
    MODELS.insert(3, (model, "JavaScript (SpiderMonkey)"))


def load(url: str, model: str, concurrency: int, seconds: float):
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker():
        client = httpclient.InferenceServerClient(url)
        a = np.random.rand(4).astype(np.float32)
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        mine = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            client.infer(model, inputs)
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)
        client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--footprint-only", action="store_true",
                   help="only the size, load time and memory table")
    p.add_argument("--componentize-js", help="componentize-js's cli.js: add SpiderMonkey rows")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-python-"))
    proc = None
    try:
        repo = work / "repository"
        repo.mkdir()
        for m in ("add_sub", "pytorch"):
            shutil.copytree(ROOT / "examples" / "triton-python" / "repository" / m, repo / m,
                            ignore=shutil.ignore_patterns("model.wasm", "__pycache__"))
        shutil.copytree(ROOT / "examples" / "js" / "add_sub_js", repo / "add_sub_js",
                        ignore=shutil.ignore_patterns("model.wasm"))
        subprocess.run([args.bin, "build", str(repo / "add_sub_js"), "--componentize-qjs",
                        str(ROOT / "guest-sdk-js" / "node_modules" / ".bin" / "componentize-qjs")],
                       check=True, stdout=subprocess.DEVNULL)
        (repo / "add_sub_rust" / "1").mkdir(parents=True)
        (repo / "add_sub_rust" / "config.pbtxt").write_text(RUST_CONFIG)
        shutil.copy(ROOT / "model_repository" / "add_sub_wasm" / "1" / "model.wasm",
                    repo / "add_sub_rust" / "1" / "model.wasm")
        if args.componentize_js:
            build_spidermonkey(args.componentize_js, repo)
        t0 = time.perf_counter()
        subprocess.run([args.bin, "build", str(repo / "add_sub"), "--componentize-py",
                        str(ROOT / ".venv" / "bin" / "componentize-py")], check=True,
                       stdout=subprocess.DEVNULL)
        build_s = time.perf_counter() - t0
        if args.footprint_only:
            footprint(args.bin, repo, work)
            return
        t0 = time.perf_counter()
        proc, url, metrics = start_server(args.bin, repo, work, work / "cache")
        ready_s = time.perf_counter() - t0
        compiled = re.findall(r"compiled-code cache miss.*", (work / "server.log").read_text())
        print(f"tessera build: {build_s:.1f} s; server ready (cold compile) in {ready_s:.1f} s; "
              f"component {(repo / 'add_sub' / '1' / 'model.wasm').stat().st_size / 1e6:.1f} MB; "
              f"{len(compiled)} components compiled")
        print()
        print("| model | concurrency | requests/s | p50 ms | p99 ms | server CPU µs/inference | guest µs/exec |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for model, what in MODELS:
            load(url, model, 1, 1.0)  # warm-up
            for c in [int(x) for x in args.concurrency.split(",")]:
                count0 = metric(metrics, "nv_inference_exec_count", model)
                compute0 = metric(metrics, "nv_inference_compute_infer_duration_us", model)
                cpu0 = tree_cpu_seconds(proc.pid)
                lat, wall = load(url, model, c, args.seconds)
                cpu = tree_cpu_seconds(proc.pid) - cpu0
                execs = metric(metrics, "nv_inference_exec_count", model) - count0
                compute = metric(metrics, "nv_inference_compute_infer_duration_us", model) - compute0
                lat_ms = np.array(lat) * 1e3
                print(f"| {model} ({what}) | {c} | {len(lat) / wall:,.0f} | {np.percentile(lat_ms, 50):.2f} | "
                      f"{np.percentile(lat_ms, 99):.2f} | {cpu / len(lat) * 1e6:,.0f} | "
                      f"{compute / execs if execs else float('nan'):,.0f} |", flush=True)
        proc.terminate()
        proc.wait(timeout=30)
        proc = None
        print()
        footprint(args.bin, repo, work)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
