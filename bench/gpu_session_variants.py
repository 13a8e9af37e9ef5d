#!/usr/bin/env python3
"""Which session setting makes a GPU instance's session.run slower than a bare session's?

Runs one ONNX model on the CUDA provider, no server, batches back to back, in the settings that
differ between a bare onnxruntime session and a Tessera GPU instance: ONNX Runtime's default
thread pools or one intra-op and one inter-op thread (the server's default), and the default
stream or a stream of the caller's (the server gives each instance its own; made with cupy or
torch, whichever is installed, as both are on the GPU machines here). Prints µs per batch and
rows/s for each, at each batch size.

  bench/gpu_session_variants.py --wide-mlp 4096 --batches 1,8,32
  bench/gpu_session_variants.py --model model_repository/minilm
"""
import argparse, os, sys, tempfile, time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_vs_ort import example_inputs, graph_inputs, wide_mlp  # noqa: E402


def stream_pointer():
    """A CUDA stream of this process's own (cupy's or torch's), as ONNX Runtime takes it."""
    try:
        import cupy
        s = cupy.cuda.Stream(non_blocking=True)
        return s, s.ptr
    except ImportError:
        import torch
        s = torch.cuda.Stream()
        return s, s.cuda_stream


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--wide-mlp", type=int)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--seconds", type=float, default=2)
    a = p.parse_args()
    import onnxruntime as ort
    work = tempfile.mkdtemp()
    path = f"{work}/model.onnx"
    if a.wide_mlp:
        wide_mlp(path, a.wide_mlp)
    else:
        path = f"{a.model}/1/model.onnx"
    specs = graph_inputs(path)
    keep, pointer = stream_pointer()
    variants = {
        "default threads, default stream": ({}, {}),
        "1 intra/1 inter thread": ({"threads": 1}, {}),
        "own stream": ({}, {"user_compute_stream": str(pointer)}),
        "1/1 threads + own stream (server)": ({"threads": 1}, {"user_compute_stream": str(pointer)}),
        "1/1, own stream, no spinning": ({"threads": 1, "nospin": True}, {"user_compute_stream": str(pointer)}),
    }
    sizes = [int(b) for b in a.batches.split(",")]
    print(f"{a.wide_mlp and f'MLP 8x{a.wide_mlp}' or a.model}: µs per batch (rows/s)")
    print(f"{'variant':<36}" + "".join(f"{'batch ' + str(b):>22}" for b in sizes))
    for label, (opts, provider) in variants.items():
        options = ort.SessionOptions()
        if opts.get("threads"):
            options.intra_op_num_threads = options.inter_op_num_threads = opts["threads"]
        if opts.get("nospin"):
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(path, options, providers=[("CUDAExecutionProvider", {"device_id": 0, **provider})])
        cells = []
        for b in sizes:
            feed = example_inputs(specs, b)
            for _ in range(20):
                session.run(None, feed)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < a.seconds:
                session.run(None, feed)
                n += 1
            dt = (time.perf_counter() - t0) / n
            cells.append(f"{dt * 1e6:>9.0f} ({b / dt:>9,.0f})")
        print(f"{label:<36}" + "".join(f"{c:>22}" for c in cells))
        del session
    del keep


if __name__ == "__main__":
    main()
