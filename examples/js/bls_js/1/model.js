// Triton's synchronous BLS example as a JavaScript handler: runs the model named by
// MODEL_NAME on INPUT0 and INPUT1 through the server's queue and returns its OUTPUT0 and
// OUTPUT1. Build: `tessera build examples/js/bls_js`.
import { asStrings, infer, input, model } from "@tessera/guest";

export const handler = model({
  executeRequest(request) {
    const [callee] = asStrings(input(request, "MODEL_NAME"));
    const response = infer(callee, {
      inputs: [input(request, "INPUT0"), input(request, "INPUT1")],
      requestedOutputs: ["OUTPUT0", "OUTPUT1"],
    });
    return { outputs: response.outputs };
  },
});
