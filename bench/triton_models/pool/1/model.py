"""pool: masked mean pooling + L2 normalisation (numpy) in Triton's Python backend.

TOKEN_EMBEDDINGS: FP32 [batch, seq, dim], ATTENTION_MASK: INT64 [batch, seq]
  ->  EMBEDDING: FP32 [batch, dim] = normalize(sum(emb * mask) / max(sum(mask), 1e-9)).
"""
import numpy as np
import triton_python_backend_utils as pb_utils


def pool(emb, mask):
    m = mask.astype(np.float32)[:, :, None]
    summed = (emb * m).sum(axis=1)
    mean = summed / np.maximum(m.sum(axis=1), 1e-9)
    norm = np.linalg.norm(mean, axis=1, keepdims=True)
    return (mean / np.maximum(norm, 1e-12)).astype(np.float32)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            emb = pb_utils.get_input_tensor_by_name(request, "TOKEN_EMBEDDINGS").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "ATTENTION_MASK").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("EMBEDDING", pool(emb, mask))]))
        return responses
