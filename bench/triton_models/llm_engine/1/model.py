"""A decoupled Triton Python model over llama-cpp-python: the usual per-request loop (reset the
context, evaluate the prompt, sample token by token, send each), as users write it."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from llama_cpp import Llama


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config["parameters"]
        self.llm = Llama(model_path=params["gguf"]["string_value"], n_ctx=2048, n_batch=512,
                         n_threads=int(params["threads"]["string_value"]), verbose=False)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().flatten()
            n = int(pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().flatten()[0])
            count = 0
            for token in self.llm.generate(ids.tolist(), top_k=1, temp=0.0, reset=True):
                if request.is_cancelled():
                    break
                out = pb_utils.Tensor("output_ids", np.array([[[token]]], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                count += 1
                if count >= n:
                    break
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
