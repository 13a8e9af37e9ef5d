// Triton's add_sub as a JavaScript handler: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1
// (FP32, any shape the config allows). Build: `tessera build examples/js/add_sub_js`.
import { asF32, fromF32, input, invalidInput, log, model, wantsOutput } from "@tessera/guest";

export const handler = model({
  initialize(config) {
    log.info(`add_sub_js ready (max_batch_size ${config.max_batch_size ?? 0})`);
  },
  executeRequest(request) {
    const a = input(request, "INPUT0");
    const b = input(request, "INPUT1");
    if (a.shape.join() !== b.shape.join()) {
      throw invalidInput(`INPUT0 has shape [${a.shape}] but INPUT1 has shape [${b.shape}]`);
    }
    const x = asF32(a);
    const y = asF32(b);
    const outputs = [];
    if (wantsOutput(request, "OUTPUT0")) outputs.push(fromF32("OUTPUT0", a.shape, x.map((v, i) => v + y[i])));
    if (wantsOutput(request, "OUTPUT1")) outputs.push(fromF32("OUTPUT1", a.shape, x.map((v, i) => v - y[i])));
    return { outputs };
  },
});
