// Types of @tessera/guest and of the WIT values it passes (wit/tessera.wit, as componentize-qjs
// maps them: records are objects with camelCase keys, enums their case names, variants
// `{ tag, val }`, s64 a number). Written by hand from the WIT; keep them in step with it.

export type Datatype =
  | "bool" | "uint8" | "uint16" | "uint32" | "uint64" | "int8" | "int16" | "int32" | "int64"
  | "fp16" | "fp32" | "fp64" | "bytes";

export type TensorData = { tag: "raw"; val: Uint8Array } | { tag: "elements"; val: Uint8Array[] };

export interface Tensor {
  name: string;
  datatype: Datatype;
  shape: number[];
  data: TensorData;
}

export type ParameterValue =
  | { tag: "bool"; val: boolean } | { tag: "int"; val: number }
  | { tag: "double"; val: number } | { tag: "string"; val: string };

export interface Parameter { key: string; value: ParameterValue }

export interface Request {
  id: string;
  inputs: Tensor[];
  requestedOutputs: string[];
  parameters: Parameter[];
}

export interface Response { outputs: Tensor[]; parameters?: Parameter[] }

export type ErrorKind =
  | "model-not-found" | "model-not-ready" | "invalid-input" | "quota-exceeded" | "timeout"
  | "internal";

export class HandlerError extends Error {
  constructor(kind: ErrorKind, message: string);
  kind: ErrorKind;
}
export function invalidInput(message: string): HandlerError;
export function internal(message: string): HandlerError;
export function modelNotFound(message: string): HandlerError;

/** The model's config.pbtxt as Triton's JSON (64-bit integers as numbers, as Triton writes them). */
export type ModelConfig = Record<string, any>;

export interface ModelSpec {
  initialize?(config: ModelConfig): void;
  /** One request; a thrown error fails it alone. */
  executeRequest?(request: Request, config: ModelConfig): Response;
  /** A whole batch: one Response (or Error) per request, in order. */
  execute?(requests: Request[], config: ModelConfig): (Response | Error)[];
  finalize?(): void;
}
/** The `handler` export: `export const handler = model({...})`. */
export function model(spec: ModelSpec): unknown;

export interface StreamingSpec {
  initialize?(config: ModelConfig): void;
  /** One request: a generator yields the stream's responses; a plain function gives one. */
  executeRequest(request: Request, config: ModelConfig): Iterator<Response> | Response;
  finalize?(): void;
}
/** The `decoupled-handler` export of a decoupled model:
 * `export const decoupledHandler = streaming({...})`. */
export function streaming(spec: StreamingSpec): unknown;

export function input(request: Request, name: string): Tensor;
export function wantsOutput(request: Request, name: string): boolean;

export function view(tensor: Tensor, datatype: Exclude<Datatype, "bool" | "fp16" | "bytes">):
  Uint8Array | Int8Array | Uint16Array | Int16Array | Uint32Array | Int32Array
  | BigUint64Array | BigInt64Array | Float32Array | Float64Array;
export function asF32(tensor: Tensor): Float32Array;
export function asF64(tensor: Tensor): Float64Array;
export function asI32(tensor: Tensor): Int32Array;
export function asI64(tensor: Tensor): BigInt64Array;
export function asU8(tensor: Tensor): Uint8Array;
export function asBool(tensor: Tensor): boolean[];
export function asStrings(tensor: Tensor): string[];

export function tensor(name: string, datatype: Datatype, shape: number[], values: ArrayLike<number | bigint>): Tensor;
export function fromF32(name: string, shape: number[], values: ArrayLike<number>): Tensor;
export function fromI32(name: string, shape: number[], values: ArrayLike<number>): Tensor;
export function fromI64(name: string, shape: number[], values: ArrayLike<bigint>): Tensor;
export function fromStrings(name: string, shape: number[], strings: string[]): Tensor;

export function utf8Encode(text: string): Uint8Array;
export function utf8Decode(bytes: Uint8Array, what?: string): string;

export function infer(
  model: string,
  request: { inputs: Tensor[]; requestedOutputs?: string[]; parameters?: Parameter[]; id?: string },
  version?: number | null,
): Response;

/** The responses of a streamed call (`inferStream`). */
export interface ResponseStream extends IterableIterator<Response> {
  /** The next response if one has arrived: `undefined` if none has yet, `null` once ended. */
  tryNext(): Response | undefined | null;
  /** Cancels the call. */
  close(): void;
}

export function inferStream(
  model: string,
  request: { inputs: Tensor[]; requestedOutputs?: string[]; parameters?: Parameter[]; id?: string },
  version?: number | null,
): ResponseStream;

export const log: {
  debug(message: unknown): void;
  info(message: unknown): void;
  warn(message: unknown): void;
  error(message: unknown): void;
};

export interface Metric {
  increment(value: number): void;
  set(value: number): void;
  observe(value: number): void;
  value(): number;
}

export interface MetricFamily {
  metric(labels?: Record<string, string>, buckets?: number[]): Metric;
}

export function metricFamily(
  name: string,
  description: string,
  kind: "counter" | "gauge" | "histogram",
): MetricFamily;
