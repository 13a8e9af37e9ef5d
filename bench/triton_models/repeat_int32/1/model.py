"""repeat_int32 for Triton's Python backend: one response per element of IN, each after its
DELAY (ms), then a final flag after WAIT (ms). The peer of tessera's examples/repeat."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = int(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0])
            for i, value in enumerate(values):
                if delays[i]:
                    time.sleep(delays[i] / 1000)
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
            if wait:
                time.sleep(wait / 1000)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
