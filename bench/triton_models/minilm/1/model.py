"""minilm: an ONNX sentence encoder run by onnxruntime (Python API) inside Triton's Python backend.

input_ids, attention_mask, token_type_ids: INT64 [batch, seq]  ->  last_hidden_state: FP32
[batch, seq, 384]. Parameters: model_path (absolute, or relative to this model's folder),
intra_op_thread_count / inter_op_thread_count (default 1, as tessera's ONNX backend).

Several requests in one execute() (dynamic_batching) are padded with 0 (mask 0) to the longest
sequence, run as one session.run, and split back (each request gets its own sequence length).
"""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _param(config, key, default):
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = _param(config, "model_path", os.path.join(args["model_version"], "model.onnx"))
        if not os.path.isabs(path):
            path = os.path.normpath(os.path.join(args["model_repository"], path))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(_param(config, "intra_op_thread_count", "1"))
        opts.inter_op_num_threads = int(_param(config, "inter_op_thread_count", "1"))
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(path, sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.output = "last_hidden_state"

    def execute(self, requests):
        feeds = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS}
                 for r in requests]
        if len(feeds) == 1:
            hidden = self.session.run([self.output], feeds[0])[0]
            return [pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(self.output, hidden.astype(np.float32))])]
        rows = [f["input_ids"].shape[0] for f in feeds]
        seqs = [f["input_ids"].shape[1] for f in feeds]
        width = max(seqs)
        merged = {}
        for name in INPUTS:
            merged[name] = np.concatenate(
                [np.pad(f[name], ((0, 0), (0, width - f[name].shape[1]))) for f in feeds])
        hidden = self.session.run([self.output], merged)[0]
        responses, start = [], 0
        for n, seq in zip(rows, seqs):
            part = np.ascontiguousarray(hidden[start:start + n, :seq, :], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(self.output, part)]))
            start += n
        return responses
