#!/usr/bin/env python3
"""What one ONNX Runtime call of all-MiniLM-L6-v2 int8 costs, by batch size and sequence length.

    .venv/bin/python bench/minilm_scaling.py [model_repository/minilm/1/model.onnx]

Uses the onnxruntime wheel that tessera loads (scripts/setup-python.sh), one intra-op thread as
in model_repository/minilm. Prints a markdown table: milliseconds per call and per sentence. If
the time per sentence falls as the batch grows, dynamic batching pays on this CPU; if it stays
flat, the model is compute-bound and batching cannot raise throughput.
"""
import sys
import time

import numpy as np
import onnxruntime as ort

SHAPES = [(1, 8), (1, 16), (1, 32), (4, 16), (8, 16), (16, 16), (32, 16), (16, 32)]
RUNS = 20


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "model_repository/minilm/1/model.onnx"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, {RUNS} runs per shape (median)")
    print()
    print("| batch | tokens | ms per call | ms per sentence | µs per token |")
    print("|---:|---:|---:|---:|---:|")
    for batch, tokens in SHAPES:
        feed = {
            "input_ids": np.full((batch, tokens), 2000, dtype=np.int64),
            "attention_mask": np.ones((batch, tokens), dtype=np.int64),
            "token_type_ids": np.zeros((batch, tokens), dtype=np.int64),
        }
        for _ in range(3):
            session.run(None, feed)
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        ms = float(np.median(times)) * 1e3
        print(f"| {batch} | {tokens} | {ms:.2f} | {ms / batch:.2f} | {ms * 1e3 / (batch * tokens):.0f} |")


if __name__ == "__main__":
    main()
