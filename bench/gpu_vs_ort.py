#!/usr/bin/env python3
"""Tessera on a GPU against ONNX Runtime's own throughput on the same GPU (issue 13's measure).

For one ONNX model:
  1. Tessera: the model served with dynamic batching on the GPU (KIND_GPU, one instance),
     clients at increasing concurrency each sending one-row requests (--rows for more; binary KServe v2 over HTTP,
     one keep-alive connection per client process): rows per second, p99 latency, server CPU time
     per inference, and the average batch the batcher formed;
  2. then, with the server stopped (the GPU to itself), the bare engine: an onnxruntime
     InferenceSession with the CUDA provider, no server, running batches of the (rounded) size
     Tessera formed at each concurrency back to back: rows per second;
  3. the ratio of the two. Target at saturation: >= 0.90.

It starts the server itself (TESSERA_BIN, ORT_DYLIB_PATH and LD_LIBRARY_PATH from the caller,
e.g. `source scripts/gpu/env.sh`), on a temporary repository, and prints one table.

  bench/gpu_vs_ort.py --model model_repository/minilm --concurrency 1,4,16,64
  bench/gpu_vs_ort.py --wide-mlp 4096 --concurrency 1,4,16,64     # a generated 8-layer MLP
  bench/gpu_vs_ort.py --cpu --model model_repository/minilm         # both on the CPU (no GPU needed)
  bench/gpu_vs_ort.py --wide-mlp 4096 --load perf_analyzer --instances 2   # C++ load, 2 instances

The load: Python client processes (default), or Triton's perf_analyzer (--load perf_analyzer;
PERF_ANALYZER names the binary, default `perf_analyzer` on PATH), whose C++ client costs far less
CPU per request. The "busy" column is the share of all cores busy during the level: near 100 %
means the machine (clients and server together) was the limit, not the GPU.
"""
import argparse, http.client, json, multiprocessing, os, shutil, signal, statistics, subprocess, sys, tempfile, time

import numpy as np


def wide_mlp(path, width, layers=8, features=1024):
    """An MLP much larger than the examples (width x width matrices), made offline with onnx."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits, prev, dim = [], [], "INPUT", features
    for i in range(layers):
        w = (rng.standard_normal((dim, width)) / np.sqrt(dim)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = "OUTPUT" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu" if i < layers - 1 else "Identity", [f"m{i}"], [out]))
        prev, dim = out, width
    graph = helper.make_graph(nodes, "wide_mlp",
                              [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["N", features])],
                              [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["N", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)


def graph_inputs(onnx_path):
    """(name, non-batch dims, is int64) of each graph input, read with onnx (no session)."""
    import onnx
    graph = onnx.load(onnx_path, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    out = []
    for i in graph.input:
        if i.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim][1:]
        out.append((i.name, dims, i.type.tensor_type.elem_type == onnx.TensorProto.INT64))
    return out


def example_inputs(specs, rows, seq=32):
    """Inputs for `rows` rows: random floats, or token ids / masks for a BERT-style model."""
    rng = np.random.default_rng(1)
    out = {}
    for name, dims, is_int in specs:
        shape = [rows] + [d if d > 0 else seq for d in dims]
        if is_int:
            if "ids" in name and "type" not in name:
                out[name] = rng.integers(1000, 5000, size=shape, dtype=np.int64)
            elif "type" in name:
                out[name] = np.zeros(shape, dtype=np.int64)
            else:
                out[name] = np.ones(shape, dtype=np.int64)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def bare_engine(onnx_path, specs, sizes, seconds, provider):
    """Rows per second of a bare session at each batch size."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if provider == "CPUExecutionProvider":  # the server's CPU instances' settings
        options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, options, providers=[provider])
    if provider not in session.get_providers():
        sys.exit("the bare engine has no CUDA provider: run with the onnxruntime-gpu wheel on PYTHONPATH")
    rates = {}
    for b in sorted(set(sizes)):
        feed = example_inputs(specs, b)
        for _ in range(10):
            session.run(None, feed)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            session.run(None, feed)
            n += 1
        rates[b] = n * b / (time.perf_counter() - t0)
    return rates


DTYPES = {np.float32: "FP32", np.int64: "INT64"}


def client(args):
    port, model, feed, seconds, out_names = args
    header_inputs, body = [], b""
    for name, value in feed.items():
        raw = value.tobytes()
        header_inputs.append({"name": name, "shape": list(value.shape), "datatype": DTYPES[value.dtype.type],
                              "parameters": {"binary_data_size": len(raw)}})
        body += raw
    header = json.dumps({"inputs": header_inputs,
                         "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in out_names]}).encode()
    payload = header + body
    conn = http.client.HTTPConnection("127.0.0.1", port)
    latencies, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        conn.request("POST", f"/v2/models/{model}/infer", payload,
                     {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")  # an Exception: Pool.map re-raises it
        latencies.append(time.perf_counter() - t0)
    return latencies


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_ticks():
    """(busy, total) jiffies of all cores, from /proc/stat."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def perf_analyzer(port, model, conc, seconds, work, feed, rows):
    """perf_analyzer at one concurrency, requests of `rows` rows over HTTP, each row `feed` (what
    the Python clients send): returns p99 (seconds) from its own report."""
    csv, data = f"{work}/pa-{conc}.csv", f"{work}/pa-data.json"
    with open(data, "w") as f:
        json.dump({"data": [{name: {"content": value.reshape(-1).tolist(), "shape": list(value.shape[1:])}
                             for name, value in feed.items()}]}, f)
    subprocess.run([os.environ.get("PERF_ANALYZER", "perf_analyzer"), "-m", model, "-u", f"127.0.0.1:{port}",
                    "--input-data", data,
                    "-i", "http", "--concurrency-range", f"{conc}:{conc}", "-b", str(rows),
                    # three windows averaged, whatever their spread (as ../shared's v2_load.sh falls back to)
                    "--measurement-interval", str(int(seconds * 1000 / 3)), "--max-trials", "3",
                    "--stability-percentage", "1000", "-f", csv],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=seconds * 10 + 60)
    header, row = [line.split(",") for line in open(csv).read().splitlines()[:2]]
    return float(dict(zip(header, row))["p99 latency"]) / 1e6


def stats(port, model):
    """Counters from the model's statistics: inferences, executions, queue ns (summed over
    requests), and per phase (input, infer, output) ns summed over batches."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", f"/v2/models/{model}/stats")
    s = json.loads(conn.getresponse().read())["model_stats"][0]
    phases = [sum(int(b[p]["ns"]) for b in s["batch_stats"]) for p in ("compute_input", "compute_infer", "compute_output")]
    return (int(s["inference_count"]), int(s["execution_count"]), int(s["inference_stats"]["queue"]["ns"]), phases)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder with config.pbtxt and 1/model.onnx")
    p.add_argument("--wide-mlp", type=int, help="generate an MLP of this width instead")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--port", type=int, default=18100)
    p.add_argument("--cpu", action="store_true", help="both sides on the CPU (checks the script anywhere)")
    p.add_argument("--instances", type=int, default=1, help="instances of the model (instance_group count)")
    p.add_argument("--load", choices=["python", "perf_analyzer"], default="python")
    p.add_argument("--intra", type=int, help="the model's intra_op_thread_count (0: ONNX Runtime's default)")
    p.add_argument("--rows", type=int, default=1,
                   help="rows per request (1: the batcher joins one-row requests; more: fewer requests "
                        "for the same rows, where the request rate and not the engine is the limit)")
    a = p.parse_args()
    binary = os.environ.get("TESSERA_BIN", "target/release/tessera")
    work = tempfile.mkdtemp(prefix="gpu-bench-")
    try:
        name = "bench_model"
        os.makedirs(f"{work}/repo/{name}/1")
        onnx_path = f"{work}/repo/{name}/1/model.onnx"
        if a.wide_mlp:
            wide_mlp(onnx_path, a.wide_mlp)
            label = f"MLP 8x{a.wide_mlp}"
        else:
            shutil.copy(f"{a.model}/1/model.onnx", onnx_path)
            label = os.path.basename(a.model.rstrip("/"))
        specs = graph_inputs(onnx_path)
        import onnx
        outs = [o.name for o in onnx.load(onnx_path, load_external_data=False).graph.output]
        # Inputs and outputs are auto-completed from the file; the batcher and placement are set.
        with open(f"{work}/repo/{name}/config.pbtxt", "w") as f:
            f.write(f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {a.max_batch}\n'
                    f'dynamic_batching {{ max_queue_delay_microseconds: 100 }}\n'
                    + (f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{a.intra}" }} }}\n'
                       if a.intra is not None else "")
                    + (f"instance_group [{{ kind: KIND_CPU count: {a.instances} }}]\n" if a.cpu
                       else f"instance_group [{{ kind: KIND_GPU count: {a.instances} gpus: [0] }}]\n"))
        server = subprocess.Popen([binary, "--model-repository", f"{work}/repo", "--http-port", str(a.port),
                                   "--allow-grpc", "false", "--allow-metrics", "false", "--strict-model-config=false",
                                   "--strict-readiness=true", "--store", f"{work}/store"],
                                  stdout=subprocess.DEVNULL, stderr=open(f"{work}/server.log", "w"))
        try:
            for _ in range(600):
                try:
                    c = http.client.HTTPConnection("127.0.0.1", a.port)
                    c.request("GET", "/v2/health/ready")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
                if server.poll() is not None:
                    sys.exit(open(f"{work}/server.log").read())
                time.sleep(0.5)
            else:
                sys.exit("the server did not become ready:\n" + open(f"{work}/server.log").read())
            feed = example_inputs(specs, 1)
            request = example_inputs(specs, a.rows)
            rows_table = []
            for conc in [int(c) for c in a.concurrency.split(",")]:
                if a.load == "perf_analyzer":
                    # perf_analyzer warms up by itself; its window is the level's, measured here
                    # as for the Python clients (server stats and CPU around the whole run).
                    inf0, exe0, queue0, phases0 = stats(a.port, name)
                    cpu0, t0, ticks0 = cpu_seconds(server.pid), time.perf_counter(), busy_ticks()
                    p99 = perf_analyzer(a.port, name, conc, a.seconds, work, feed, a.rows) * 1e3
                else:
                    with multiprocessing.Pool(conc) as pool:
                        pool.map(client, [(a.port, name, request, 1.0, outs)] * conc)  # warm up
                        inf0, exe0, queue0, phases0 = stats(a.port, name)
                        cpu0, t0, ticks0 = cpu_seconds(server.pid), time.perf_counter(), busy_ticks()
                        lat = [x for l in pool.map(client, [(a.port, name, request, a.seconds, outs)] * conc) for x in l]
                    p99 = statistics.quantiles(lat, n=100)[98] * 1e3 if len(lat) > 1 else float("nan")
                wall, cpu = time.perf_counter() - t0, cpu_seconds(server.pid) - cpu0
                ticks1 = busy_ticks()
                busy = (ticks1[0] - ticks0[0]) / max(1, ticks1[1] - ticks0[1])
                inf1, exe1, queue1, phases1 = stats(a.port, name)
                rows = (inf1 - inf0) / wall
                batches = max(1, exe1 - exe0)
                batch = (inf1 - inf0) / batches
                # Where a batch's time goes on the instance, and how much of the wall time the
                # instances were executing (the rest they waited for a batch).
                phase_us = [(b - a0) / batches / 1e3 for a0, b in zip(phases0, phases1)]
                executing = sum(b - a0 for a0, b in zip(phases0, phases1)) / 1e9 / wall / a.instances
                queue_us = (queue1 - queue0) / max(1, inf1 - inf0) / 1e3
                rows_table.append((conc, rows, p99, cpu / max(1, inf1 - inf0) * 1e6, batch, busy,
                                   queue_us, phase_us, executing))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
        sizes = [max(1, min(a.max_batch, round(r[4]))) for r in rows_table]
        device = "CPU" if a.cpu else "GPU"
        # The bare engine at the largest batch is its saturation: the issue's measure (>= 0.90).
        rates = bare_engine(onnx_path, specs, sizes + [a.max_batch], a.seconds,
                            "CPUExecutionProvider" if a.cpu else "CUDAExecutionProvider")
        print(f"\n{label}: Tessera (HTTP, dynamic batching, {a.instances} {device} instance(s), load: {a.load}, "
              f"{a.rows} row(s) per request{'' if a.intra is None else f', intra_op_thread_count {a.intra}'}) vs bare ONNX Runtime, same {device}; saturation: bare at batch "
              f"{a.max_batch}, {rates[a.max_batch]:,.0f} rows/s")
        print(f"{'conc':>5} {'rows/s':>10} {'p99 ms':>8} {'CPU us/inf':>11} {'avg batch':>10} {'busy':>5} "
              f"{'bare rows/s':>12} {'ratio':>6} {'vs sat':>6} {'queue us':>9} {'in/run/out us per batch':>24} "
              f"{'executing':>9}")
        for (conc, rows, p99, cpu_us, batch, busy, queue_us, phase_us, executing), size in zip(rows_table, sizes):
            phases = "/".join(f"{p:.0f}" for p in phase_us)
            print(f"{conc:>5} {rows:>10,.0f} {p99:>8.2f} {cpu_us:>11.1f} {batch:>10.1f} {busy:>5.0%} "
                  f"{rates[size]:>12,.0f} {rows / rates[size]:>6.2f} {rows / rates[a.max_batch]:>6.2f} {queue_us:>9.0f} {phases:>24} {executing:>9.0%}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
