"""A running sum per sequence for Triton's Python backend, kept in the model by correlation id
(Triton's Python backend has no host-kept implicit state)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def scalar(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]

            sequence = int(scalar("CORRID"))
            total = (0 if scalar("START") else self.sums.get(sequence, 0)) + int(scalar("INPUT"))
            if scalar("END"):
                self.sums.pop(sequence, None)
            else:
                self.sums[sequence] = total
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([[total]], np.int64))]))
        return responses
