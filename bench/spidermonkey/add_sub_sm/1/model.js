// Triton's add_sub on SpiderMonkey (componentize-js), written against the WIT bindings
// directly (jco's conventions): OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32.
function f32(tensor) {
  const bytes = tensor.data.val;
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
}

function output(name, shape, values) {
  return { name, datatype: "fp32", shape, data: { tag: "raw", val: new Uint8Array(values.buffer) } };
}

export const handler = {
  initialize(configJson) {},
  execute(requests) {
    return requests.map((request) => {
      const a = request.inputs.find((t) => t.name === "INPUT0");
      const b = request.inputs.find((t) => t.name === "INPUT1");
      if (!a || !b) {
        return { tag: "err", val: { kind: "invalid-input", message: "INPUT0 and INPUT1 are required" } };
      }
      const x = f32(a), y = f32(b);
      const sum = new Float32Array(x.length), diff = new Float32Array(x.length);
      for (let i = 0; i < x.length; i++) { sum[i] = x[i] + y[i]; diff[i] = x[i] - y[i]; }
      return { tag: "ok", val: { outputs: [output("OUTPUT0", a.shape, sum), output("OUTPUT1", a.shape, diff)], parameters: [] } };
    });
  },
  finalize() {},
};
