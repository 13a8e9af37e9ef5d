#!/usr/bin/env python3
"""Markdown reports of the bench/*.sh scripts, from the summary.tsv that v2_load.sh writes.

    python3 bench/report.py add_sub   SUMMARY.tsv [proto=http]
    python3 bench/report.py pipeline  SUMMARY.tsv [proto=http] [delay_us=2000]
    python3 bench/report.py batching  SUMMARY.tsv [proto=http] [delay_us=500]
    python3 bench/report.py transports SUMMARY.tsv [model=text_orientation]
    python3 bench/report.py python_model SUMMARY.tsv [proto=http]

Rows are grouped by (label, model, concurrency); with several repetitions the median of each
column is shown. "~" = perf_analyzer could not stabilise in at least one repetition (3 windows
averaged). "CPU µs/inf" = server CPU time (process tree, all cores) per inference. "client CPU %"
= perf_analyzer's own CPU time over its run (client_cpu.tsv beside SUMMARY.tsv, written by
bench/timed_perf_analyzer.sh), in % of one core; "client µs/inf" = that per inference.
Ratios: infer/s above 1 and latency / CPU below 1 favour the first-named side.
"""
import csv
import os
import statistics
import sys
from collections import OrderedDict


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def tsv_rows(path):
    """The rows of a tab-separated file with a header; none if the file does not exist."""
    try:
        with open(path) as f:
            yield from csv.DictReader(f, delimiter="\t")
    except FileNotFoundError:
        return


def load_client(path):
    """(label, model, conc) -> perf_analyzer CPU in % of one core (median over runs)."""
    runs = {}
    for r in tsv_rows(path):
        user, sys_, wall = num(r["user_s"]), num(r["sys_s"]), num(r["wall_s"])
        if None in (user, sys_, wall) or not wall or not r["conc"].isdigit():
            continue
        runs.setdefault((r["label"], r["model"], int(r["conc"])), []).append((user + sys_) / wall * 100)
    return {k: statistics.median(v) for k, v in runs.items()}


def load(path):
    client = load_client(os.path.join(os.path.dirname(path), "client_cpu.tsv"))
    groups = OrderedDict()
    for r in tsv_rows(path):
        key = (r["label"], r["model"], int(r["conc"].rstrip("~")))
        groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        def med(col):
            vals = [num(r[col]) for r in rs]
            vals = [v for v in vals if v is not None]
            return statistics.median(vals) if vals else None
        g = {"reps": len(rs), "unstable": sum(r["conc"].endswith("~") for r in rs),
             "ips": med("infer_per_s"), "p50": med("p50_us"), "p99": med("p99_us"),
             "cpu": med("server_cpu_pct"), "load1": med("load1")}
        # CPU % of one core / (inferences per second) -> CPU µs per inference
        g["cpu_us"] = (g["cpu"] * 1e4 / g["ips"]) if g["cpu"] is not None and g["ips"] else None
        g["client"] = client.get(key)
        g["client_us"] = (g["client"] * 1e4 / g["ips"]) if g["client"] is not None and g["ips"] else None
        out[key] = g
    return out


def f0(v):
    return "-" if v is None else f"{v:,.0f}"


def f1(v):
    return "-" if v is None else f"{v:.1f}"


def f2(v):
    return "-" if v is None else f"{v:.2f}"


def ratio(a, b, col):
    if a is None or b is None or a[col] is None or not b[col]:
        return None
    return a[col] / b[col]


def diff(a, b, col):
    if a is None or b is None or a[col] is None or b[col] is None:
        return None
    return a[col] - b[col]


def concs(data, labels=None):
    return sorted({k[2] for k in data if labels is None or k[0] in labels})


def rows_table(data, series, extra_header, note):
    """series: [(label, model, [extra cells])] -> one row per (series, concurrency)."""
    print(note)
    print()
    print(f"| {' | '.join(extra_header)} | conc | infer/s | p50 µs | p99 µs | server CPU % | CPU µs/inf | "
          "client CPU % | client µs/inf | reps |")
    print("|" + "---|" * len(extra_header) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, model, cells in series:
        for c in concs(data):
            g = data.get((label, model, c))
            if g is None:
                continue
            flag = "~" if g["unstable"] else ""
            print(f"| {' | '.join(cells)} | {c}{flag} | {f0(g['ips'])} | {f0(g['p50'])} | {f0(g['p99'])} | "
                  f"{f0(g['cpu'])} | {f0(g['cpu_us'])} | {f0(g['client'])} | {f0(g['client_us'])} | {g['reps']} |")
    print()


def add_sub(data, opts):
    series = [("tessera", "add_sub", ["tessera", "add_sub", "ONNX Runtime"]),
              ("tessera", "add_sub_wasm", ["tessera", "add_sub_wasm", "Wasm handler"]),
              ("triton", "add_sub", ["Triton 2.51", "add_sub", "Python backend"])]
    rows_table(data, series, ["server", "model", "backend"],
               f"### add_sub: tessera (ONNX, Wasm) vs Triton (Python backend), {opts.get('proto', 'http')}")
    print("Triton's add_sub is ../shared/peers/triton's (bench/triton_models/add_sub): it has "
          "`dynamic_batching { }`; tessera's add_sub and add_sub_wasm have none.")
    print()
    print("### Ratios")
    print()
    print("wasm/onnx: tessera add_sub_wasm against tessera add_sub (same server, same tensors); "
          "+p50 µs = latency the Wasm handler adds per request over ONNX Runtime. "
          "wasm/triton and onnx/triton: against Triton's Python-backend add_sub.")
    print()
    print("| conc | wasm/onnx infer/s | wasm−onnx p50 µs | wasm/onnx p99 | wasm/triton infer/s | wasm/triton p50 | "
          "wasm/triton p99 | wasm/triton CPU µs/inf | onnx/triton infer/s | onnx/triton p50 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in concs(data):
        o, w, t = (data.get(("tessera", "add_sub", c)), data.get(("tessera", "add_sub_wasm", c)),
                   data.get(("triton", "add_sub", c)))
        d = diff(w, o, "p50")
        print(f"| {c} | {f2(ratio(w, o, 'ips'))} | {'-' if d is None else f'{d:+,.0f}'} | {f2(ratio(w, o, 'p99'))} | "
              f"{f2(ratio(w, t, 'ips'))} | {f2(ratio(w, t, 'p50'))} | {f2(ratio(w, t, 'p99'))} | "
              f"{f2(ratio(w, t, 'cpu_us'))} | {f2(ratio(o, t, 'ips'))} | {f2(ratio(o, t, 'p50'))} |")


def pipeline(data, opts):
    delay = opts.get("delay_us", "2000")
    variants = [("tessera", "tessera", "Wasm + ONNX Runtime", "no"),
                ("tessera-batched", "tessera", "Wasm + ONNX Runtime", f"yes ({delay} µs)"),
                ("triton", "Triton 2.51", "Python backend + onnxruntime", "no"),
                ("triton-batched", "Triton 2.51", "Python backend + onnxruntime", f"yes ({delay} µs)")]
    series = [(label, "embed_text", [server, backend, batching]) for label, server, backend, batching in variants]
    rows_table(data, series, ["server", "pipeline", "minilm dynamic batching"],
               f"### embed_text (tokenize -> MiniLM int8 -> pool), {opts.get('proto', 'http')}")
    print("### Ratios tessera / Triton (same minilm batching on both sides)")
    print()
    print("| minilm batching | conc | infer/s | p50 | p99 | CPU µs/inf |")
    print("|---|---:|---:|---:|---:|---:|")
    for suffix, name in (("", "no"), ("-batched", f"yes ({delay} µs)")):
        for c in concs(data):
            a, b = data.get(("tessera" + suffix, "embed_text", c)), data.get(("triton" + suffix, "embed_text", c))
            if a is None or b is None:
                continue
            print(f"| {name} | {c} | {f2(ratio(a, b, 'ips'))} | {f2(ratio(a, b, 'p50'))} | "
                  f"{f2(ratio(a, b, 'p99'))} | {f2(ratio(a, b, 'cpu_us'))} |")
    if any(k[0].endswith("-batched") for k in data):
        print()
        print("### Ratios minilm batched / unbatched (same server)")
        print()
        print("| server | conc | infer/s | p50 | p99 | CPU µs/inf |")
        print("|---|---:|---:|---:|---:|---:|")
        for server in ("tessera", "triton"):
            for c in concs(data):
                a, b = data.get((server + "-batched", "embed_text", c)), data.get((server, "embed_text", c))
                if a is None or b is None:
                    continue
                print(f"| {server} | {c} | {f2(ratio(a, b, 'ips'))} | {f2(ratio(a, b, 'p50'))} | "
                      f"{f2(ratio(a, b, 'p99'))} | {f2(ratio(a, b, 'cpu_us'))} |")


def batching(data, opts):
    delay = opts.get("delay_us", "?")
    series = [("tessera", "mlp_classifier", ["mlp_classifier", "no"]),
              ("tessera", "mlp_classifier_batched", ["mlp_classifier_batched", f"yes, max_queue_delay {delay} µs"])]
    rows_table(data, series, ["model", "dynamic batching"],
               f"### tessera dynamic batching: mlp_classifier vs mlp_classifier_batched "
               f"(max_queue_delay_microseconds: {delay}), {opts.get('proto', 'http')}")
    print("### Ratios batched / unbatched")
    print()
    print("| conc | infer/s | p50 | p99 | batched−unbatched p50 µs | CPU µs/inf |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c in concs(data):
        b, u = data.get(("tessera", "mlp_classifier_batched", c)), data.get(("tessera", "mlp_classifier", c))
        if b is None or u is None:
            continue
        d = diff(b, u, "p50")
        print(f"| {c} | {f2(ratio(b, u, 'ips'))} | {f2(ratio(b, u, 'p50'))} | {f2(ratio(b, u, 'p99'))} | "
              f"{'-' if d is None else f'{d:+,.0f}'} | {f2(ratio(b, u, 'cpu_us'))} |")


def python_model(data, opts):
    series = [("tessera", "add_sub", ["tessera", "Wasm sandbox, Tessera's pb_utils"]),
              ("triton", "add_sub", ["Triton 2.51", "Python backend (stub process)"])]
    rows_table(data, series, ["server", "runs the model.py in"],
               f"### Triton's add_sub model.py, unchanged, {opts.get('proto', 'http')}")
    print("### Ratios tessera / Triton")
    print()
    print("| conc | infer/s | p50 | p99 | CPU µs/inf |")
    print("|---:|---:|---:|---:|---:|")
    for c in concs(data):
        a, b = data.get(("tessera", "add_sub", c)), data.get(("triton", "add_sub", c))
        if a is None or b is None:
            continue
        print(f"| {c} | {f2(ratio(a, b, 'ips'))} | {f2(ratio(a, b, 'p50'))} | "
              f"{f2(ratio(a, b, 'p99'))} | {f2(ratio(a, b, 'cpu_us'))} |")


TRANSPORTS = [("http", "HTTP, binary tensors"), ("http-shm", "HTTP + system shared memory"),
              ("grpc", "gRPC, raw contents"), ("grpc-shm", "gRPC + system shared memory")]


def transports(data, opts):
    model = opts.get("model", "text_orientation")
    series = [(label, model, [name]) for label, name in TRANSPORTS]
    rows_table(data, series, ["transport"], f"### tessera {model}: HTTP vs gRPC vs shared memory")
    print("### Ratios against HTTP (same server, same model)")
    print()
    print("| transport | conc | infer/s | p50 | p99 | CPU µs/inf |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, name in TRANSPORTS[1:]:
        for c in concs(data):
            a, b = data.get((label, model, c)), data.get(("http", model, c))
            if a is None or b is None:
                continue
            print(f"| {name} | {c} | {f2(ratio(a, b, 'ips'))} | {f2(ratio(a, b, 'p50'))} | "
                  f"{f2(ratio(a, b, 'p99'))} | {f2(ratio(a, b, 'cpu_us'))} |")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("add_sub", "pipeline", "batching", "transports",
                                                 "python_model"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    opts = dict(a.split("=", 1) for a in sys.argv[3:])
    data = load(sys.argv[2])
    if not data:
        print("no successful measurement in " + sys.argv[2])
        sys.exit(1)
    {"add_sub": add_sub, "pipeline": pipeline, "batching": batching,
     "transports": transports, "python_model": python_model}[sys.argv[1]](data, opts)


if __name__ == "__main__":
    main()
