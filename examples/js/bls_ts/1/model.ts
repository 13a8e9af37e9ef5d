// Triton's synchronous BLS example as a TypeScript handler: runs the model named by MODEL_NAME
// on INPUT0 and INPUT1 through the server's queue. Build: `tessera build examples/js/bls_ts`.
import { asStrings, infer, input, model, type Request, type Response } from "@tessera/guest";

export const handler = model({
  executeRequest(request: Request): Response {
    const [callee]: string[] = asStrings(input(request, "MODEL_NAME"));
    const response: Response = infer(callee, {
      inputs: [input(request, "INPUT0"), input(request, "INPUT1")],
      requestedOutputs: ["OUTPUT0", "OUTPUT1"],
    });
    return { outputs: response.outputs };
  },
});
