#!/usr/bin/env python3
"""Correctness gate for an embed_text pipeline on any KServe v2 server (tessera or Triton).

Sends "A man is eating food." and "A man is eating a piece of bread." (one batch of 2, and each
alone) to MODEL via tritonclient.http and checks the embeddings: FP32 [2, 384], unit length,
the batch-of-2 rows equal the single requests, and their cosine is near 0.755 (the value the fp32
all-MiniLM-L6-v2 gives; the int8 model lands close to it).

  python bench/embed_check.py [HOST:PORT] [MODEL]      (default 127.0.0.1:18000 embed_text)
Prints one line "cosine=0.xxxx"; exits 1 when a check fails.
"""
import sys

import numpy as np
import tritonclient.http as httpclient

URL = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:18000"
MODEL = sys.argv[2] if len(sys.argv) > 2 else "embed_text"
TEXTS = ["A man is eating food.", "A man is eating a piece of bread."]


def embed(client, texts):
    data = np.array([[t.encode()] for t in texts], dtype=object)
    inp = httpclient.InferInput("TEXT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    out = client.infer(MODEL, [inp], outputs=[httpclient.InferRequestedOutput("EMBEDDING")])
    return out.as_numpy("EMBEDDING")


client = httpclient.InferenceServerClient(url=URL)
both = embed(client, TEXTS)
ones = np.concatenate([embed(client, [t]) for t in TEXTS])
cos = float(both[0] @ both[1])
problems = []
if both.shape != (2, 384) or both.dtype != np.float32:
    problems.append(f"EMBEDDING is {both.dtype} {both.shape}, expected float32 (2, 384)")
if not np.allclose(np.linalg.norm(both, axis=1), 1.0, atol=1e-3):
    problems.append(f"norms {np.linalg.norm(both, axis=1)} are not 1")
# int8 dynamic quantisation computes its scales over the whole batch, so padding a batch can move
# the values slightly: compare by cosine, not bit for bit.
for i in range(2):
    if float(both[i] @ ones[i]) < 0.99:
        problems.append(f"row {i} of the batch differs from the single request (cos {float(both[i] @ ones[i]):.4f})")
if not 0.70 <= cos <= 0.80:
    problems.append(f"cosine {cos:.4f} outside [0.70, 0.80] (expected about 0.755)")
print(f"{URL} {MODEL}: cosine={cos:.4f} single-request cosine={float(ones[0] @ ones[1]):.4f}"
      f" first values {np.round(both[0][:4], 4).tolist()}")
if problems:
    print("FAILED: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
