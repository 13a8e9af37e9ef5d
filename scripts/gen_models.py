#!/usr/bin/env python3
"""Generates Tessera's small, self-made test models into model_repository/.

    .venv/bin/python scripts/gen_models.py [--repo model_repository]

Models (all ONNX, opset 17, IR version 8, built with the `onnx` package only):

  add_sub/                 OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1,
                           FP32 [batch, 16]; max_batch_size 8, no dynamic batching
                           (the unbatched baseline for perf comparisons).
  mlp_classifier/          INPUT FP32 [batch, 64] -> Gemm(64x128) -> Relu ->
                           Gemm(128x10) -> Softmax -> PROBS FP32 [batch, 10];
                           weights from np.random.default_rng(0); labels.txt;
                           max_batch_size 64. Small on purpose: overhead-bound.
  mlp_classifier_batched/  the same model and labels, with dynamic_batching.
  simple_sequence/         Triton's simple_sequence contract (a stateful model with the
                           START and READY control inputs): OUTPUT = (INPUT + START) * READY,
                           INT32 [batch, 1]; max_batch_size 8. Triton's sequence client
                           examples run against it.
  simple/, simple_int8/    Triton's `simple` example contract (its client examples' model):
                           OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32 (INT8)
                           [batch, 16]; max_batch_size 8.
  simple_identity/         BYTES [batch, n] in, the same out (ONNX Identity on strings), for
                           Triton's string client examples; max_batch_size 8.

Output is deterministic: running the script twice writes byte-identical files
(no timestamps, fixed producer fields, fixed RNG seed). Files are rewritten only
when their content changes.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17; ONNX Runtime 1.31 accepts 3..11
PRODUCER = "tessera-gen_models"
PRODUCER_VERSION = "1"

ROOT = Path(__file__).resolve().parent.parent

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def write_if_changed(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def finish(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version=PRODUCER_VERSION,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


def fp32_batched(name: str, width: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])


# ---------------------------------------------------------------------------
# add_sub
# ---------------------------------------------------------------------------

def add_sub_model() -> bytes:
    graph = helper.make_graph(
        nodes=[
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        name="add_sub",
        inputs=[fp32_batched("INPUT0", 16), fp32_batched("INPUT1", 16)],
        outputs=[fp32_batched("OUTPUT0", 16), fp32_batched("OUTPUT1", 16)],
    )
    return finish(graph)


ADD_SUB_CONFIG = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
# No dynamic_batching block: this is the unbatched baseline.
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""


# ---------------------------------------------------------------------------
# mlp_classifier
# ---------------------------------------------------------------------------

def mlp_classifier_model() -> bytes:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((64, 128)) / np.sqrt(64.0)).astype(np.float32)
    b1 = (rng.standard_normal(128) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((128, 10)) / np.sqrt(128.0)).astype(np.float32)
    b2 = (rng.standard_normal(10) * 0.1).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "fc1.weight"),
        numpy_helper.from_array(b1, "fc1.bias"),
        numpy_helper.from_array(w2, "fc2.weight"),
        numpy_helper.from_array(b2, "fc2.bias"),
    ]
    graph = helper.make_graph(
        nodes=[
            helper.make_node("Gemm", ["INPUT", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1"),
            helper.make_node("Relu", ["fc1"], ["relu1"], name="relu1"),
            helper.make_node("Gemm", ["relu1", "fc2.weight", "fc2.bias"], ["logits"], name="fc2"),
            helper.make_node("Softmax", ["logits"], ["PROBS"], name="softmax", axis=-1),
        ],
        name="mlp_classifier",
        inputs=[fp32_batched("INPUT", 64)],
        outputs=[fp32_batched("PROBS", 10)],
        initializer=inits,
    )
    return finish(graph)


def mlp_config(name: str, dynamic_batching: bool) -> str:
    batching = (
        "dynamic_batching {\n  max_queue_delay_microseconds: 500\n}\n"
        if dynamic_batching
        else "# No dynamic_batching block: see mlp_classifier_batched for the batched twin.\n"
    )
    return f"""\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {{
    name: "INPUT"
    data_type: TYPE_FP32
    dims: [ 64 ]
  }}
]
output [
  {{
    name: "PROBS"
    data_type: TYPE_FP32
    dims: [ 10 ]
    label_filename: "labels.txt"
  }}
]
{batching}instance_group [
  {{
    count: 1
    kind: KIND_CPU
  }}
]
"""


def simple_sequence_model() -> bytes:
    def int32_batched(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT", "START"], ["started"]),
            helper.make_node("Mul", ["started", "READY"], ["OUTPUT"]),
        ],
        "simple_sequence",
        [int32_batched("INPUT"), int32_batched("START"), int32_batched("READY")],
        [int32_batched("OUTPUT")],
    )
    return finish(graph)


SIMPLE_SEQUENCE_CONFIG = """\
# Triton's simple_sequence (docs/examples in triton-inference-server/server): a stateful model
# whose host fills in the START and READY control inputs; OUTPUT = (INPUT + START) * READY.
# Generated by scripts/gen_models.py.
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    {
      name: "START"
      control [
        {
          kind: CONTROL_SEQUENCE_START
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "READY"
      control [
        {
          kind: CONTROL_SEQUENCE_READY
          int32_false_true: [ 0, 1 ]
        }
      ]
    }
  ]
}
input [
  {
    name: "INPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
output [
  {
    name: "OUTPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
instance_group [
  {
    kind: KIND_CPU
  }
]
"""


# ---------------------------------------------------------------------------
# Triton's `simple` family (the models of Triton's own client examples)
# ---------------------------------------------------------------------------

def simple_add_sub_model(name: str, element: int) -> bytes:
    def batched(tensor: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(tensor, element, ["batch", 16])

    graph = helper.make_graph(
        nodes=[
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        name=name,
        inputs=[batched("INPUT0"), batched("INPUT1")],
        outputs=[batched("OUTPUT0"), batched("OUTPUT1")],
    )
    return finish(graph)


def simple_config(name: str, data_type: str) -> str:
    return f"""\
# Triton's `{name}` (the model its client examples call, simple_http_infer_client.py and
# the rest): OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1. Triton's is a TensorFlow
# graph; this one is ONNX with the same contract. Generated by scripts/gen_models.py.
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{
    name: "INPUT0"
    data_type: {data_type}
    dims: [ 16 ]
  }},
  {{
    name: "INPUT1"
    data_type: {data_type}
    dims: [ 16 ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: {data_type}
    dims: [ 16 ]
  }},
  {{
    name: "OUTPUT1"
    data_type: {data_type}
    dims: [ 16 ]
  }}
]
"""


def simple_identity_model() -> bytes:
    def strings(tensor: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(tensor, TensorProto.STRING, ["batch", "n"])

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        "simple_identity",
        [strings("INPUT0")],
        [strings("OUTPUT0")],
    )
    return finish(graph)


SIMPLE_IDENTITY_CONFIG = """\
# Triton's `simple_identity` (its string client examples): OUTPUT0 is INPUT0, BYTES of any
# length, embedded NULs and non-UTF-8 bytes included. Generated by scripts/gen_models.py.
name: "simple_identity"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_STRING
    dims: [ -1 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_STRING
    dims: [ -1 ]
  }
]
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(ROOT / "model_repository"),
                    help="model repository folder (default: <repo root>/model_repository)")
    args = ap.parse_args(argv)
    repo = Path(args.repo)

    write_if_changed(repo / "add_sub" / "1" / "model.onnx", add_sub_model())
    write_if_changed(repo / "add_sub" / "config.pbtxt", ADD_SUB_CONFIG.encode())

    mlp = mlp_classifier_model()
    labels = ("\n".join(LABELS) + "\n").encode()
    for name, batched in (("mlp_classifier", False), ("mlp_classifier_batched", True)):
        write_if_changed(repo / name / "1" / "model.onnx", mlp)
        write_if_changed(repo / name / "labels.txt", labels)
        write_if_changed(repo / name / "config.pbtxt", mlp_config(name, batched).encode())

    write_if_changed(repo / "simple_sequence" / "1" / "model.onnx", simple_sequence_model())
    write_if_changed(repo / "simple_sequence" / "config.pbtxt", SIMPLE_SEQUENCE_CONFIG.encode())

    for name, element, data_type in (("simple", TensorProto.INT32, "TYPE_INT32"),
                                     ("simple_int8", TensorProto.INT8, "TYPE_INT8")):
        write_if_changed(repo / name / "1" / "model.onnx", simple_add_sub_model(name, element))
        write_if_changed(repo / name / "config.pbtxt", simple_config(name, data_type).encode())
    write_if_changed(repo / "simple_identity" / "1" / "model.onnx", simple_identity_model())
    write_if_changed(repo / "simple_identity" / "config.pbtxt", SIMPLE_IDENTITY_CONFIG.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
