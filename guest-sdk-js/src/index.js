// @tessera/guest: Tessera handlers in JavaScript, over the WIT of `wit/tessera.wit`.
//
// A handler module exports `handler` (the WIT `handler` interface) made by `model({...})`, or,
// for a decoupled model, `decoupledHandler` made by `streaming({...})`:
//
//   import { model, asF32, fromF32, invalidInput } from "@tessera/guest";
//   export const handler = model({
//     executeRequest(request) { ... return { outputs: [...] }; },
//   });
//
// `tessera build <model-dir>` makes the component (componentize-qjs, QuickJS, without the
// component model's async ABI, which wasmtime 48 does not run). QuickJS has no TextEncoder or
// TextDecoder: utf8Encode/utf8Decode here stand in for them.

import inference from "tessera:inference/inference@0.1.0";
import logImport from "tessera:inference/log@0.1.0";
import metricsImport from "tessera:inference/metrics@0.1.0";

/** An error that becomes the request's KServe error: `kind` picks the status code. */
export class HandlerError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

export const invalidInput = (message) => new HandlerError("invalid-input", message);
export const internal = (message) => new HandlerError("internal", message);
export const modelNotFound = (message) => new HandlerError("model-not-found", message);

const ERROR_KINDS = new Set([
  "model-not-found", "model-not-ready", "invalid-input", "quota-exceeded", "timeout", "internal",
]);

function toWitError(e) {
  if (e instanceof HandlerError && ERROR_KINDS.has(e.kind)) {
    return { kind: e.kind, message: String(e.message) };
  }
  // A plain exception: its message, as an internal error (HTTP 500).
  const message = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return { kind: "internal", message };
}

/**
 * The `initialize` export of both kinds of handler: parses the config, keeps it, runs the
 * model's own `initialize`; what that throws makes the model UNAVAILABLE with the message.
 */
function initializer(initialize, keep) {
  return (configJson) => {
    const config = JSON.parse(configJson);
    keep(config);
    if (initialize) {
      try {
        initialize(config);
      } catch (e) {
        throw e instanceof Error ? `${e.name}: ${e.message}` : String(e);
      }
    }
  };
}

/**
 * The handler export. `executeRequest(request, config)` answers one request (a thrown error
 * fails that request only), or `execute(requests, config)` a whole batch (one result each).
 * `initialize(config)` may throw to make the model UNAVAILABLE with the message.
 */
export function model({ initialize, execute, executeRequest, finalize }) {
  let config = null;
  return {
    initialize: initializer(initialize, (parsed) => {
      config = parsed;
    }),
    execute(requests) {
      if (execute) {
        let results;
        try {
          results = execute(requests, config);
        } catch (e) {
          const err = toWitError(e);
          return requests.map(() => ({ tag: "err", val: err }));
        }
        if (!Array.isArray(results) || results.length !== requests.length) {
          const err = { kind: "internal", message: "execute must return one result per request" };
          return requests.map(() => ({ tag: "err", val: err }));
        }
        return results.map((r) => {
          try {
            return r instanceof Error ? { tag: "err", val: toWitError(r) }
              : { tag: "ok", val: answer(r, "execute") };
          } catch (e) {
            return { tag: "err", val: toWitError(e) };
          }
        });
      }
      return requests.map((request) => {
        try {
          return { tag: "ok", val: answer(executeRequest(request, config), "executeRequest") };
        } catch (e) {
          return { tag: "err", val: toWitError(e) };
        }
      });
    },
    finalize() {
      if (finalize) finalize();
    },
  };
}

function response(r) {
  return { outputs: r?.outputs ?? [], parameters: r?.parameters ?? [] };
}

const DATATYPES = new Set(["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
  "int64", "fp16", "fp32", "fp64", "bytes"]);
const PARAMETER_TAGS = new Set(["bool", "int", "double", "string"]);

/**
 * What the WIT lowering would choke on, named: a malformed output or parameter there traps the
 * instance (its state lost) with "unreachable executed"; here it fails the request, saying why.
 */
function checkShape(r, by) {
  const outputs = r.outputs ?? [];
  if (!Array.isArray(outputs)) {
    throw new Error(`${by} returned outputs as ${typeof outputs}; outputs is an array of tensors (tensor(name, datatype, shape, values))`);
  }
  outputs.forEach((t, i) => {
    const where = `${by}: output ${i}`;
    if (t == null || typeof t !== "object") throw new Error(`${where} is ${t === null ? "null" : typeof t}, not a tensor (use tensor(name, datatype, shape, values))`);
    if (typeof t.name !== "string") throw new Error(`${where} has no name`);
    if (!DATATYPES.has(t.datatype)) throw new Error(`${where} ('${t.name}') has datatype ${JSON.stringify(t.datatype)}; one of ${[...DATATYPES].join(", ")}`);
    if (!Array.isArray(t.shape) && !ArrayBuffer.isView(t.shape)) throw new Error(`${where} ('${t.name}') has no shape array`);
    const data = t.data;
    const rawOk = data?.tag === "raw" && data.val instanceof Uint8Array;
    const elementsOk = data?.tag === "elements" && Array.isArray(data.val) && data.val.every((e) => e instanceof Uint8Array);
    if (!rawOk && !elementsOk) throw new Error(`${where} ('${t.name}') has data that is neither { tag: "raw", val: Uint8Array } nor { tag: "elements", val: Uint8Array[] }`);
  });
  const parameters = r.parameters ?? [];
  if (!Array.isArray(parameters)) {
    throw new Error(`${by} returned parameters as ${typeof parameters}; parameters is an array of { key, value: { tag, val } }`);
  }
  for (const p of parameters) {
    if (typeof p?.key !== "string" || !PARAMETER_TAGS.has(p?.value?.tag)) {
      const shown = JSON.stringify(p, (_, v) => (typeof v === "bigint" ? `${v}n` : v));
      throw new Error(`${by} returned a parameter that is not { key: string, value: { tag: "bool" | "int" | "double" | "string", val } }: ${shown}`);
    }
  }
}

/** A handler's answer, checked: a response object, not nothing and not a Promise. */
function answer(r, by) {
  if (r == null || typeof r !== "object") {
    throw new Error(`${by} returned ${r === null ? "null" : typeof r} where a response ({ outputs }) is due`);
  }
  if (typeof r.then === "function") {
    throw new Error(`${by} returned a Promise: handlers run synchronously (the host does not enable component-model async)`);
  }
  checkShape(r, by);
  return response(r);
}

/**
 * The decoupled handler export (`model_transaction_policy { decoupled: true }`):
 * `export const decoupledHandler = streaming({...})`. `executeRequest(request, config)` may be
 * a generator (`function*`): each response it yields goes to the caller as it comes, and the
 * stream ends when it returns; a thrown error ends the stream with that error. A plain function
 * answers with one response, its last. A caller that goes away stops the generator at its next
 * `yield`. The instance's streams take turns, one response each, in the host's `resume` calls
 * (each runs turns for up to `TURN_MS`), so a long stream does not hold the instance from the
 * next request.
 */
export function streaming({ initialize, executeRequest, finalize }) {
  let config = null;
  let running = []; // { iterator, sender } of each stream whose generator has not ended
  return {
    initialize: initializer(initialize, (parsed) => {
      config = parsed;
    }),
    execute(pairs) {
      for (const [request, sender] of pairs) {
        const iterator = start(executeRequest, request, sender, config);
        if (iterator) running.push({ iterator, sender });
        else sender[Symbol.dispose]?.();
      }
    },
    resume() {
      const end = Date.now() + TURN_MS;
      while (running.length > 0 && Date.now() < end) {
        running = running.filter((s) => advance(s) || (s.sender[Symbol.dispose]?.(), false));
      }
      return running.length > 0 ? 0 : null;
    },
    finalize() {
      for (const { iterator, sender } of running) {
        iterator.return?.();
        sender[Symbol.dispose]?.();
      }
      running = [];
      if (finalize) finalize();
    },
  };
}

/** How long one `resume` runs the streams' turns before new requests may join. */
const TURN_MS = 10;

/** A send that did not go through: the caller has gone or the stream has ended. */
class SendFailed {}

function sendTo(sender, r, final) {
  // A malformed response is the handler's error (it ends the stream with the reason); only a
  // send that fails is `SendFailed`.
  checkShape(r ?? {}, "executeRequest");
  try {
    sender.send(response(r), final);
  } catch (e) {
    throw new SendFailed(e);
  }
}

function endWith(sender, e) {
  if (e instanceof SendFailed) return;
  try {
    sender.sendError(toWitError(e));
  } catch {
    // the caller has gone
  }
}

/** Runs `executeRequest`: its generator, to take turns, or null when the stream has ended. */
function start(executeRequest, request, sender, config) {
  try {
    const produced = executeRequest(request, config);
    if (produced != null && typeof produced.next === "function") return produced;
    sendTo(sender, produced, true);
  } catch (e) {
    endWith(sender, e);
  }
  return null;
}

/** Sends a generator's next response; false once its stream has ended. */
function advance({ iterator, sender }) {
  try {
    const next = iterator.next();
    if (next.done) {
      sender.finish();
      return false;
    }
    sendTo(sender, next.value, false);
    return true;
  } catch (e) {
    endWith(sender, e);
    iterator.return?.(); // a generator stopped early runs its `finally` blocks
    return false;
  }
}

// --- tensors ---------------------------------------------------------------------------------

/** The named input of a request, or an invalid-input error naming it. */
export function input(request, name) {
  const t = request.inputs.find((i) => i.name === name);
  if (!t) throw invalidInput(`input '${name}' is required`);
  return t;
}

/** Whether the caller asked for `name` (all outputs when it named none). */
export function wantsOutput(request, name) {
  return request.requestedOutputs.length === 0 || request.requestedOutputs.includes(name);
}

const VIEWS = {
  uint8: Uint8Array, int8: Int8Array, uint16: Uint16Array, int16: Int16Array,
  uint32: Uint32Array, int32: Int32Array, uint64: BigUint64Array, int64: BigInt64Array,
  fp32: Float32Array, fp64: Float64Array,
};

function raw(tensor, datatype) {
  if (tensor.datatype !== datatype) {
    throw invalidInput(`${tensor.name} is ${tensor.datatype.toUpperCase()}, expected ${datatype.toUpperCase()}`);
  }
  if (tensor.data.tag !== "raw") throw invalidInput(`${tensor.name} has no raw data`);
  return tensor.data.val;
}

/** A typed array over a fixed-size tensor's little-endian bytes (a copy: aligned). */
export function view(tensor, datatype) {
  const Type = VIEWS[datatype];
  if (!Type) throw internal(`no typed view for ${datatype}`);
  const bytes = raw(tensor, datatype);
  if (bytes.byteLength % Type.BYTES_PER_ELEMENT !== 0) {
    throw invalidInput(`${tensor.name}: ${bytes.byteLength} bytes are not whole ${datatype} elements`);
  }
  return new Type(bytes.slice().buffer);
}

export const asF32 = (t) => view(t, "fp32");
export const asF64 = (t) => view(t, "fp64");
export const asI32 = (t) => view(t, "int32");
export const asI64 = (t) => view(t, "int64");
export const asU8 = (t) => view(t, "uint8");
export const asBool = (t) => Array.from(raw(t, "bool"), (b) => b !== 0);

/** A BYTES tensor's elements as strings (UTF-8; invalid bytes are an invalid-input error). */
export function asStrings(tensor) {
  if (tensor.datatype !== "bytes" || tensor.data.tag !== "elements") {
    throw invalidInput(`${tensor.name} is ${tensor.datatype.toUpperCase()}, expected BYTES`);
  }
  return tensor.data.val.map((b) => utf8Decode(b, tensor.name));
}

/** A tensor of `datatype` from a typed array (or an array of numbers). */
export function tensor(name, datatype, shape, values) {
  const Type = VIEWS[datatype];
  if (!Type) throw internal(`no typed array for ${datatype}`);
  const typed = values instanceof Type ? values : Type.from(values);
  checkCount(name, shape, typed.length);
  return { name, datatype, shape: shape.map(Number), data: { tag: "raw", val: new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength) } };
}

export const fromF32 = (name, shape, values) => tensor(name, "fp32", shape, values);
export const fromI32 = (name, shape, values) => tensor(name, "int32", shape, values);
export const fromI64 = (name, shape, values) => tensor(name, "int64", shape, values);

/** A BYTES tensor of UTF-8 strings. */
export function fromStrings(name, shape, strings) {
  checkCount(name, shape, strings.length);
  return { name, datatype: "bytes", shape: shape.map(Number), data: { tag: "elements", val: strings.map(utf8Encode) } };
}

function checkCount(name, shape, count) {
  const want = shape.reduce((n, d) => n * Number(d), 1);
  if (want !== count) throw internal(`${name}: shape [${shape}] holds ${want} elements, got ${count}`);
}

// --- UTF-8 (QuickJS has no TextEncoder/TextDecoder) -------------------------------------------

export function utf8Encode(text) {
  const out = [];
  for (const ch of text) {
    const c = ch.codePointAt(0);
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return new Uint8Array(out);
}

export function utf8Decode(bytes, what = "text") {
  let out = "";
  for (let i = 0; i < bytes.length;) {
    const b = bytes[i];
    const n = b < 0x80 ? 1 : (b >> 5) === 6 ? 2 : (b >> 4) === 14 ? 3 : (b >> 3) === 30 ? 4 : 0;
    if (n === 0 || i + n > bytes.length) throw invalidInput(`${what} is not valid UTF-8`);
    let c = n === 1 ? b : b & (0xff >> (n + 1));
    for (let k = 1; k < n; k++) {
      const next = bytes[i + k];
      if ((next >> 6) !== 2) throw invalidInput(`${what} is not valid UTF-8`);
      c = (c << 6) | (next & 63);
    }
    const min = [0, 0, 0x80, 0x800, 0x10000][n];
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
      throw invalidInput(`${what} is not valid UTF-8`);
    }
    out += String.fromCodePoint(c);
    i += n;
  }
  return out;
}

// --- calling other models (BLS) and logging ------------------------------------------------------

/**
 * Runs `modelName` through the server's queue, as any request: the response, or a
 * HandlerError with the callee's kind and message.
 */
export function infer(modelName, { inputs, requestedOutputs = [], parameters = [], id = "" }, version = null) {
  try {
    return inference.infer(modelName, version, { id, inputs, requestedOutputs, parameters });
  } catch (e) {
    throw calleeError(e);
  }
}

/** The callee's error (a WIT `error`, thrown or passed) as a HandlerError of its kind. */
function calleeError(e) {
  const payload = e?.payload ?? e;
  if (payload && typeof payload === "object" && "kind" in payload) {
    return new HandlerError(payload.kind, payload.message);
  }
  return e;
}

/**
 * Runs `modelName` through the server's queue, as `infer` does, and returns its responses as a
 * stream: every response of a decoupled model (Triton's `exec(decoupled=True)`), the one
 * response of any other. Iterate it to wait for each response in turn (`for (const r of
 * stream)`); a callee's error throws a HandlerError and ends the stream. In a streaming
 * handler's `resume`, `tryNext()` takes a response only if one has arrived: `undefined` when
 * none has yet (return, and the host resumes the handler when one comes), `null` once the
 * stream has ended. `close()`, or leaving a `for` loop early, cancels the call.
 */
export function inferStream(modelName, { inputs, requestedOutputs = [], parameters = [], id = "" }, version = null) {
  try {
    return new ResponseStream(
      inference.inferStream(modelName, version, { id, inputs, requestedOutputs, parameters }),
    );
  } catch (e) {
    throw calleeError(e);
  }
}

class ResponseStream {
  constructor(stream) {
    this._stream = stream;
  }

  [Symbol.iterator]() {
    return this;
  }

  /** The iterator protocol: waits for the next response. */
  next() {
    if (this._stream === null) return { done: true, value: undefined };
    const next = this._stream.next();
    if (next === null) {
      this.close();
      return { done: true, value: undefined };
    }
    return { done: false, value: this._taken(next) };
  }

  /** Leaving a `for` loop early: the call is cancelled. */
  return() {
    this.close();
    return { done: true, value: undefined };
  }

  tryNext() {
    if (this._stream === null) return null;
    const polled = this._stream.tryNext();
    switch (polled.tag) {
      case "pending":
        return undefined;
      case "ended":
        this.close();
        return null;
      default:
        return this._taken(polled.val);
    }
  }

  /** A response, or the error that ends the stream (thrown). */
  _taken(result) {
    if (result.tag === "err") {
      this.close();
      throw calleeError(result.val);
    }
    return result.val;
  }

  close() {
    if (this._stream !== null) {
      this._stream[Symbol.dispose]?.();
      this._stream = null;
    }
  }

  [Symbol.dispose]() {
    this.close();
  }
}

export const log = {
  debug: (message) => logImport.log("debug", String(message)),
  info: (message) => logImport.log("info", String(message)),
  warn: (message) => logImport.log("warn", String(message)),
  error: (message) => logImport.log("error", String(message)),
};

function metricCall(call) {
  try {
    return call();
  } catch (e) {
    throw internal(String(e?.payload ?? e));
  }
}

/**
 * A custom metric family on the server's `/metrics`: `kind` is "counter", "gauge" or
 * "histogram". Its `metric(labels, buckets)` is the series with `labels` (an object of strings;
 * `buckets`, a histogram's upper bounds), with `increment`, `set`, `observe` and `value`. A
 * family of an existing name is that family; misuse throws an internal error saying what is
 * wrong. Keep metrics at module level or in the handler's state: a series lives while its
 * metric is held (the instance's life).
 */
export function metricFamily(name, description, kind) {
  const family = metricCall(() => metricsImport.family(String(name), String(description), kind));
  return {
    metric(labels = {}, buckets = undefined) {
      const pairs = Object.entries(labels).map(([k, v]) => [String(k), String(v)]);
      const bounds = buckets === undefined ? undefined : Array.from(buckets, Number);
      const series = metricCall(() => family.metric(pairs, bounds));
      return {
        increment: (value) => metricCall(() => series.increment(Number(value))),
        set: (value) => metricCall(() => series.set(Number(value))),
        observe: (value) => metricCall(() => series.observe(Number(value))),
        value: () => metricCall(() => series.value()),
      };
    },
  };
}
