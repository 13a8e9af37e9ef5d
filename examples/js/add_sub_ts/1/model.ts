// Triton's add_sub as a TypeScript handler: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.
// `tessera build examples/js/add_sub_ts` strips the types (typescript) and builds the component
// (componentize-qjs); guest-sdk-js/src/index.d.ts types the SDK for editors and `tsc --noEmit`.
import {
  asF32, fromF32, input, invalidInput, log, model, wantsOutput,
  type ModelConfig, type Request, type Response, type Tensor,
} from "@tessera/guest";

function sameShape(a: Tensor, b: Tensor): boolean {
  return a.shape.length === b.shape.length && a.shape.every((d, i) => d === b.shape[i]);
}

export const handler = model({
  initialize(config: ModelConfig): void {
    log.info(`add_sub_ts ready (max_batch_size ${config.max_batch_size ?? 0})`);
  },
  executeRequest(request: Request): Response {
    const a: Tensor = input(request, "INPUT0");
    const b: Tensor = input(request, "INPUT1");
    if (!sameShape(a, b)) {
      throw invalidInput(`INPUT0 has shape [${a.shape}] but INPUT1 has shape [${b.shape}]`);
    }
    const x: Float32Array = asF32(a);
    const y: Float32Array = asF32(b);
    const outputs: Tensor[] = [];
    if (wantsOutput(request, "OUTPUT0")) outputs.push(fromF32("OUTPUT0", a.shape, x.map((v, i) => v + y[i])));
    if (wantsOutput(request, "OUTPUT1")) outputs.push(fromF32("OUTPUT1", a.shape, x.map((v, i) => v - y[i])));
    return { outputs };
  },
});
