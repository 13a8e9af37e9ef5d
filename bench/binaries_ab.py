#!/usr/bin/env python3
"""Two tessera binaries side by side, alternated: server CPU per request and throughput on
`add_sub` (ONNX, FP32 [1, 16], JSON over HTTP, and over gRPC as `add_sub (grpc)`), a 1 MiB
ONNX Identity (binary in and out, HTTP) and `identity_batched`, an Identity of 256 KiB rows that
the dynamic batcher joins (up to 8 rows; the 4 clients make batches of up to 4), each with 4
tritonclient threads on the same machine.
For A/B of a change on the request path.

    .venv/bin/python bench/binaries_ab.py OLD_BINARY NEW_BINARY [--reps 3] [--seconds 8] [--models a,b]

Build the older binary from a worktree or by checking it out, and copy it aside first.
Prints a markdown table (one row per run) and the means.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
MIB_ELEMENTS = 262144
ROW_ELEMENTS = 65536  # 256 KiB of FP32 per row of identity_batched


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_repository(folder: Path) -> None:
    from onnx import TensorProto, helper, save

    shutil.copytree(ROOT / "model_repository" / "add_sub", folder / "add_sub")
    model = folder / "identity_1mib"
    (model / "1").mkdir(parents=True)
    n = MIB_ELEMENTS
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])], "identity_1mib",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n])])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    save(onnx_model, str(model / "1" / "model.onnx"))
    (model / "config.pbtxt").write_text(
        'name: "identity_1mib"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {n} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {n} ] }} ]\n')


    batched = folder / "identity_batched"
    (batched / "1").mkdir(parents=True)
    row = ROW_ELEMENTS
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])], "identity_batched",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", row])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", row])])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    save(onnx_model, str(batched / "1" / "model.onnx"))
    (batched / "config.pbtxt").write_text(
        'name: "identity_batched"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'dynamic_batching { max_queue_delay_microseconds: 500 }\n'
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {row} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {row} ] }} ]\n')


MODELS = ("add_sub", "add_sub (grpc)", "identity_1mib", "identity_batched")


def grpc_request():
    import tritonclient.grpc as grpcclient

    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = grpcclient.InferInput(name, [1, 16], "FP32")
        inp.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        inputs.append(inp)
    return inputs


def request(model: str):
    if model == "identity_batched":
        x = np.ones((1, ROW_ELEMENTS), dtype=np.float32)
        inp = httpclient.InferInput("X", [1, ROW_ELEMENTS], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        return [inp], [httpclient.InferRequestedOutput("Y", binary_data=True)]
    if model == "identity_1mib":
        x = np.ones(MIB_ELEMENTS, dtype=np.float32)
        inp = httpclient.InferInput("X", [MIB_ELEMENTS], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        return [inp], [httpclient.InferRequestedOutput("Y", binary_data=True)]
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = httpclient.InferInput(name, [1, 16], "FP32")
        inp.set_data_from_numpy(np.ones((1, 16), dtype=np.float32), binary_data=False)
        inputs.append(inp)
    return inputs, None


def measure(binary: str, repo: Path, seconds: float, models) -> list[tuple[str, float, float]]:
    store = tempfile.mkdtemp(prefix="tessera-ab-store-")
    proc = subprocess.Popen([binary, "--model-repository", str(repo), "--store", store,
                             "--http-port", "18000", "--grpc-port", "18001",
                             "--metrics-port", "18002"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        probe = httpclient.InferenceServerClient("127.0.0.1:18000")
        deadline = time.monotonic() + 60
        while True:
            try:
                if probe.is_server_ready():
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{binary} not ready")
            time.sleep(0.1)
        rows = []
        for model in models:
            counts: list[int] = []
            stop = time.monotonic() + seconds

            def client():
                done = 0
                if model.endswith("(grpc)"):
                    import tritonclient.grpc as grpcclient

                    c = grpcclient.InferenceServerClient("127.0.0.1:18001")
                    inputs = grpc_request()
                    while time.monotonic() < stop:
                        c.infer("add_sub", inputs)
                        done += 1
                else:
                    c = httpclient.InferenceServerClient("127.0.0.1:18000")
                    inputs, outputs = request(model)
                    while time.monotonic() < stop:
                        c.infer(model, inputs, outputs=outputs)
                        done += 1
                counts.append(done)

            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            threads = [threading.Thread(target=client) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - cpu0
            total = sum(counts)
            rows.append((model, total / elapsed, cpu / total * 1e6))
        return rows
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(store, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--models", default=",".join(MODELS), help="a comma-separated subset of " + ", ".join(MODELS))
    args = parser.parse_args()
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    models = [m for m in MODELS if m in args.models.split(",")]
    os.environ.setdefault("ORT_DYLIB_PATH", subprocess.run(
        [str(ROOT / "scripts" / "ort-dylib-path.sh")], capture_output=True, text=True,
        check=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="tessera-ab-") as scratch:
        repo = Path(scratch) / "repository"
        make_repository(repo)
        results = []
        for _ in range(args.reps):
            for label, binary in (("old", args.old), ("new", args.new)):
                results += [(label, *row) for row in measure(binary, repo, args.seconds, models)]
    print("| binary | model | req/s | server CPU µs/request |")
    print("|---|---|---:|---:|")
    for label, model, rate, cpu in sorted(results, key=lambda r: (r[1], r[0])):
        print(f"| {label} | {model} | {rate:,.0f} | {cpu:,.0f} |")
    print()
    for model in models:
        means = {label: np.mean([r[3] for r in results if r[0] == label and r[1] == model])
                 for label in ("old", "new")}
        print(f"{model}: server CPU µs/request old {means['old']:,.0f}, new {means['new']:,.0f}, "
              f"new/old {means['new'] / means['old']:.2f}")


if __name__ == "__main__":
    main()
