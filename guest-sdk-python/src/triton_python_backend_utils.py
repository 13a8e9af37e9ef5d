"""`triton_python_backend_utils` (pb_utils) for Triton model.py files running in Tessera.

The names and behaviour of Triton's Python backend module, over Tessera's WIT imports: a
model.py written for Triton imports this module under the same name and runs unchanged, in the
Wasm sandbox. What Triton has and the sandbox cannot give (DLPack, GPU tensors, a decoupled
response sender in a non-decoupled build) raises `TritonModelException` naming it.

Tensors: with numpy installed (the host-side tests), `as_numpy()` gives real numpy arrays;
in the sandbox, where numpy has no WebAssembly build, it gives `tessera_ndarray` arrays.
"""

from __future__ import annotations

import json
import struct

import tessera_ndarray as _stand_in

try:  # pragma: no cover - which one depends on where this runs
    import numpy as np
except ImportError:  # a sandbox built without the numpy package
    np = _stand_in
# In the sandbox `numpy` is Tessera's stand-in (guest-sdk-python/src/sandbox/numpy).
HAVE_NUMPY = not getattr(np, "__tessera_stand_in__", False)

import tessera_wire as wire

# --- datatypes --------------------------------------------------------------------------------

TRITONSERVER_TYPE_INVALID = 0
TRITONSERVER_TYPE_BOOL = 1
TRITONSERVER_TYPE_UINT8 = 2
TRITONSERVER_TYPE_UINT16 = 3
TRITONSERVER_TYPE_UINT32 = 4
TRITONSERVER_TYPE_UINT64 = 5
TRITONSERVER_TYPE_INT8 = 6
TRITONSERVER_TYPE_INT16 = 7
TRITONSERVER_TYPE_INT32 = 8
TRITONSERVER_TYPE_INT64 = 9
TRITONSERVER_TYPE_FP16 = 10
TRITONSERVER_TYPE_FP32 = 11
TRITONSERVER_TYPE_FP64 = 12
TRITONSERVER_TYPE_BYTES = 13
TRITONSERVER_TYPE_BF16 = 14

# A response's flags (InferenceResponseSender.send).
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

# KServe datatype, Triton's config name, TRITONSERVER_TYPE, numpy type name.
_TYPES = [
    ("BOOL", "TYPE_BOOL", TRITONSERVER_TYPE_BOOL, "bool_"),
    ("UINT8", "TYPE_UINT8", TRITONSERVER_TYPE_UINT8, "uint8"),
    ("UINT16", "TYPE_UINT16", TRITONSERVER_TYPE_UINT16, "uint16"),
    ("UINT32", "TYPE_UINT32", TRITONSERVER_TYPE_UINT32, "uint32"),
    ("UINT64", "TYPE_UINT64", TRITONSERVER_TYPE_UINT64, "uint64"),
    ("INT8", "TYPE_INT8", TRITONSERVER_TYPE_INT8, "int8"),
    ("INT16", "TYPE_INT16", TRITONSERVER_TYPE_INT16, "int16"),
    ("INT32", "TYPE_INT32", TRITONSERVER_TYPE_INT32, "int32"),
    ("INT64", "TYPE_INT64", TRITONSERVER_TYPE_INT64, "int64"),
    ("FP16", "TYPE_FP16", TRITONSERVER_TYPE_FP16, "float16"),
    ("FP32", "TYPE_FP32", TRITONSERVER_TYPE_FP32, "float32"),
    ("FP64", "TYPE_FP64", TRITONSERVER_TYPE_FP64, "float64"),
    ("BYTES", "TYPE_STRING", TRITONSERVER_TYPE_BYTES, "object_"),
]


def _np_type(name: str):
    return getattr(np, name)


def _dtype_name(dtype) -> str:
    """numpy's name of a dtype or scalar type (`float32`, `bool`, `object`, `bytes_`)."""
    d = np.dtype(dtype) if HAVE_NUMPY else _stand_in.as_dtype(dtype)
    if HAVE_NUMPY and d.kind in "SU":
        return "object_"
    return {"bool": "bool_", "object": "object_"}.get(d.name, d.name)


def triton_string_to_numpy(triton_type_string: str):
    for _, config_name, _, np_name in _TYPES:
        if config_name == triton_type_string:
            return _np_type(np_name)
    raise TritonModelException(f"unknown Triton type '{triton_type_string}'")


def triton_to_numpy_type(data_type: int):
    for _, _, code, np_name in _TYPES:
        if code == data_type:
            return _np_type(np_name)
    if data_type == TRITONSERVER_TYPE_BF16:
        raise TritonModelException("BF16 tensors are not supported")
    return None


def numpy_to_triton_type(data_type) -> int | None:
    try:
        name = _dtype_name(data_type)
    except TypeError:
        return None
    for _, _, code, np_name in _TYPES:
        if np_name == name:
            return code
    return None


_KSERVE_BY_NP_NAME = {np_name: kserve for kserve, _, _, np_name in _TYPES}


def _kserve_of_dtype(dtype) -> str:
    if not HAVE_NUMPY and isinstance(dtype, np.dtype):  # the sandbox's arrays: a lookup
        kserve = _KSERVE_BY_NP_NAME.get({"bool": "bool_", "object": "object_"}.get(dtype.name, dtype.name))
        if kserve is not None:
            return kserve
    name = _dtype_name(dtype)
    for kserve, _, _, np_name in _TYPES:
        if np_name == name:
            return kserve
    raise TritonModelException(f"tensors of numpy type {name} are not supported")


# Output name -> the KServe datatype the model's configuration declares (set at initialize).
_DECLARED_OUTPUTS: dict = {}


def _declare_outputs(config: dict) -> None:
    _DECLARED_OUTPUTS.clear()
    for output in config.get("output", []):
        for kserve, config_name, _, _ in _TYPES:
            if config_name == output.get("data_type"):
                _DECLARED_OUTPUTS[output.get("name")] = kserve


def _wire_as_declared(tensor: "Tensor") -> "wire.WireTensor":
    """An output in the datatype its configuration declares. Triton passes a Python model's
    output on in its numpy type whatever the configuration says (its own
    examples/bls_decoupled returns int64 for an INT32 output); Tessera keeps the declared
    contract, converting when no value changes (else the server refuses the response, naming
    both types)."""
    declared = _DECLARED_OUTPUTS.get(tensor.name())
    have = tensor._wire.datatype
    if declared is None or declared == have or "BYTES" in (declared, have):
        return tensor._wire
    array = tensor.as_numpy()
    np_name = next(n for kserve, _, _, n in _TYPES if kserve == declared)
    cast = array.astype(_np_type(np_name))
    if cast.tolist() != array.tolist():
        return tensor._wire
    return wire.WireTensor.from_array(tensor.name(), declared, cast, np)


def serialize_byte_tensor(input_tensor):
    """Triton's wire form of a BYTES tensor: each element as a 4-byte length and its bytes."""
    if input_tensor.size == 0:
        return np.array([], dtype=np.object_)
    out = bytearray()
    for v in _flat(input_tensor):
        b = v if isinstance(v, bytes) else str(v).encode()
        out += struct.pack("<I", len(b)) + b
    return np.array([bytes(out)], dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor: bytes):
    items, offset = [], 0
    while offset < len(encoded_tensor):
        (n,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset:offset + n]))
        offset += n
    return np.array(items, dtype=np.object_)


def _flat(arr) -> list:
    return list(arr.flatten()) if HAVE_NUMPY else list(arr.flat)


# --- errors -----------------------------------------------------------------------------------

class TritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL):
        self._message, self._code = str(message), code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self):
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    pass


# --- tensors ----------------------------------------------------------------------------------

class Tensor:
    """A named tensor. A request's tensor stays in its wire form until `as_numpy()` is called,
    and goes on to a BLS call or a response without a copy."""

    def __init__(self, name: str, data, dtype=None):
        if not isinstance(name, str):  # as Triton's binding: a name is text
            raise TypeError(f"Tensor name must be a str, not {type(name).__name__}")
        self._name = name
        if isinstance(data, wire.WireTensor):
            self._wire, self._array = data, None
            return
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}': the data must be a numpy array, not {type(data).__name__}")
        if dtype is not None:
            data = data.astype(dtype)
        self._array = data
        self._wire = wire.WireTensor.from_array(name, _kserve_of_dtype(data.dtype), data, np)

    @classmethod
    def _from_wire(cls, tensor: "wire.WireTensor") -> "Tensor":
        t = cls.__new__(cls)
        t._name, t._wire, t._array = tensor.name, tensor, None
        return t

    def name(self) -> str:
        return self._name

    def as_numpy(self):
        if self._array is None:
            self._array = self._wire.to_array(np)
        return self._array

    def shape(self) -> list[int]:
        return list(self._wire.shape)

    def triton_dtype(self) -> int:
        return next(code for kserve, _, code, _ in _TYPES if kserve == self._wire.datatype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self):
        raise TritonModelException("DLPack is not available in the sandbox: use as_numpy()")

    @staticmethod
    def from_dlpack(name, capsule):
        raise TritonModelException("DLPack is not available in the sandbox: build the Tensor "
                                   "from an array")

    def _renamed(self, name: str) -> "wire.WireTensor":
        return self._wire if self._wire.name == name else self._wire.renamed(name)


def get_input_tensor_by_name(inference_request, name):
    return inference_request._input(name)


def get_output_tensor_by_name(inference_response, name):
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config, name):
    return _config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config, name):
    return _config_by_name(model_config, "output", name)


def _config_by_name(model_config, key, name):
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    for entry in model_config.get(key, []):
        if entry.get("name") == name:
            return entry
    return None


# --- requests and responses -------------------------------------------------------------------

class InferenceRequest:
    """A request: what `execute` receives, and what a model builds to call another model (BLS)
    with `exec()` or `async_exec()`."""

    def __init__(self, model_name="", requested_output_names=None, inputs=None, request_id="",
                 correlation_id=0, trace=None, model_version=-1, flags=0, timeout=0,
                 preferred_memory=None, parameters=None):
        if isinstance(model_name, bytes):
            model_name = model_name.decode()
        self._model_name = str(model_name)
        self._requested = list(requested_output_names or [])
        self._inputs = list(inputs or [])
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._model_version = int(model_version)
        self._flags = flags
        self._timeout = timeout
        if isinstance(parameters, str):
            parameters = json.loads(parameters)
        self._parameters = dict(parameters or {})
        self._sender = None  # a decoupled model's request: its InferenceResponseSender

    @classmethod
    def _from_wire(cls, request: "wire.WireRequest") -> "InferenceRequest":
        r = cls(requested_output_names=request.requested_outputs,
                inputs=[Tensor._from_wire(t) for t in request.inputs],
                request_id=request.id, parameters=request.parameters)
        return r

    def _input(self, name):
        for t in self._inputs:
            if t.name() == name:
                return t
        return None

    def inputs(self):
        return list(self._inputs)

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def model_name(self):
        return self._model_name

    def model_version(self):
        return self._model_version

    def requested_output_names(self):
        return list(self._requested)

    def flags(self):
        return self._flags

    def timeout(self):
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """Whether the caller has gone (a decoupled model's request; others: False)."""
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self):
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() needs a decoupled model (model_transaction_policy "
                "{ decoupled: true })")
        return self._sender

    def exec(self, decoupled=False):
        """Calls the model through the server's queue; an error comes back in the response.
        With `decoupled=True`, an iterator of the model's responses as they come (every
        response of a decoupled model, the one of any other), ending, as in Triton, with an
        empty response (the final flag's)."""
        version = None if self._model_version < 0 else self._model_version
        request = wire.WireRequest(self._request_id or "", [t._wire for t in self._inputs],
                                   self._requested, self._parameters)
        if decoupled:
            return _ResponseIterator(wire.infer_stream(self._model_name, version, request))
        try:
            outputs, parameters = wire.infer(self._model_name, version, request)
        except wire.InferError as e:
            return InferenceResponse(error=_triton_error(e))
        return InferenceResponse(output_tensors=[Tensor._from_wire(t) for t in outputs],
                                 parameters=parameters)

    async def async_exec(self, decoupled=False):
        # The sandbox has one thread: the call runs when awaited, one after another.
        return self.exec(decoupled)


def _triton_error(e) -> "TritonError":
    return TritonError(e.message, _ERROR_CODES.get(e.kind, TritonError.INTERNAL))


class _ResponseIterator:
    """What `exec(decoupled=True)` returns: the responses as they come, an error as a response
    that ends them, then an empty final response, as Triton's response iterator gives."""

    def __init__(self, stream):
        self._stream, self._done = stream, False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            outputs, parameters = next(self._stream)
        except StopIteration:
            self._done = True
            return InferenceResponse()
        except wire.InferError as e:
            self._done = True
            self._stream.close()
            return InferenceResponse(error=_triton_error(e))
        return InferenceResponse(output_tensors=[Tensor._from_wire(t) for t in outputs],
                                 parameters=parameters)

    def cancel(self):
        """Stops the call (the called model's next send fails)."""
        self._done = True
        self._stream.close()


_ERROR_CODES = {
    "model-not-found": TritonError.NOT_FOUND,
    "model-not-ready": TritonError.UNAVAILABLE,
    "invalid-input": TritonError.INVALID_ARG,
    "quota-exceeded": TritonError.UNAVAILABLE,
    "timeout": TritonError.UNAVAILABLE,
    "internal": TritonError.INTERNAL,
}
# The WIT error kind a TritonError code becomes (and with it the HTTP status).
ERROR_KINDS = {
    TritonError.NOT_FOUND: "model-not-found",
    TritonError.INVALID_ARG: "invalid-input",
    TritonError.UNAVAILABLE: "model-not-ready",
}


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None, parameters=None):
        self._outputs = list(output_tensors or [])
        for t in self._outputs:
            if not isinstance(t, Tensor):  # Triton's binding refuses these here too
                raise TypeError("InferenceResponse output_tensors must be pb_utils.Tensor "
                                f"objects, not {type(t).__name__}")
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error
        if isinstance(parameters, str):
            parameters = json.loads(parameters)
        self._parameters = dict(parameters or {})
        _check_parameters(self._parameters)

    def output_tensors(self):
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


def _check_parameters(parameters: dict) -> None:
    """Triton's checks on a response's parameters (with its words), so that a value the wire
    cannot carry fails in the model's code instead of arriving as its `repr`."""
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key).__name__}")
        if isinstance(value, bool) or isinstance(value, (str, float)):
            continue
        if isinstance(value, int):
            if not -(1 << 63) <= value < (1 << 63):
                raise TritonModelException(
                    f"parameter '{key}': {value} does not fit a 64-bit integer")
            continue
        raise TritonModelException(
            "Expect parameters values to have type bool/int/str/float, found type "
            f"{type(value).__name__}")


class InferenceResponseSender:
    """Where a decoupled model's responses to one request go (`request.get_response_sender()`).

    `send(response)` sends one response; `send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`
    ends the stream (with `response`, it is the last one). A response with an error ends the
    stream with that error. The host buffers a few responses per caller: while they are unread,
    `send` waits, so a slow reader slows the model instead of growing memory."""

    def __init__(self, sender: "wire.WireSender", requested_outputs):
        self._sender = sender
        self._requested = set(requested_outputs or [])

    def send(self, response=None, flags=0):
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if self._sender.final_sent:
            raise TritonModelException(
                "Unable to send response. Response sender has been closed.")
        try:
            if response is None:
                if not final:
                    raise TritonModelException(
                        "send() needs a response unless flags is TRITONSERVER_RESPONSE_COMPLETE_FINAL")
                self._sender.finish()
            elif response.has_error():
                err = response.error()
                self._sender.send_error(ERROR_KINDS.get(err.code(), "internal"), err.message())
            else:
                outputs = [_wire_as_declared(t) for t in response._outputs
                           if not self._requested or t.name() in self._requested]
                self._sender.send(outputs, response._parameters, final)
        except wire.SendError as e:
            raise TritonModelException(
                {"cancelled": "the request was cancelled: its caller has gone",
                 "closed": "Unable to send response. Response sender has been closed.",
                 "too-large": "the response is over the model's output limit "
                              "(max_output_bytes); the caller got an error instead"}
                .get(e.kind, e.kind)) from None

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled()


# --- logging and metrics ----------------------------------------------------------------------

class LogLevel:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Triton's logger: messages go to the server's log, tagged with the model."""

    @staticmethod
    def log(message, level=LogLevel.INFO):
        wire.log({LogLevel.INFO: "info", LogLevel.WARNING: "warn", LogLevel.ERROR: "error",
                  LogLevel.VERBOSE: "debug"}.get(level, "info"), str(message))

    @staticmethod
    def log_info(message):
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, LogLevel.VERBOSE)


class MetricFamily:
    """Triton's custom metric family: a metric name, its description and kind, on the server's
    `/metrics`. A family of an existing name is that family (its first description stays; another
    kind is an error). Its series are made with `Metric(labels, buckets)` and live as long as the
    `Metric` object does."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __init__(self, name, description, kind):
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily: name and description must be strings")
        if kind not in self._KINDS:
            raise TritonModelException(
                f"MetricFamily: unknown kind {kind!r}; use MetricFamily.COUNTER, GAUGE or HISTOGRAM")
        self.name, self.description, self.kind = name, description, kind
        self._family = _metrics(lambda: wire.metric_family(name, description, self._KINDS[kind]))

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - Triton's name
        """The series with `labels` (a dict of strings); `buckets`, a histogram's upper bounds."""
        labels = {} if labels is None else labels
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("Metric: labels must be a dict of strings to strings")
        bounds = None if buckets is None else [float(b) for b in buckets]
        return Metric(_metrics(lambda: wire.metric(self._family, list(labels.items()), bounds)))


class Metric:
    """One series of a `MetricFamily`."""

    def __init__(self, series):
        self._series = series

    def increment(self, value):
        """Adds `value` (a counter's must not be negative)."""
        _metrics(lambda: wire.metric_update(self._series, "increment", float(value)))

    def set(self, value):
        """Sets a gauge's value."""
        _metrics(lambda: wire.metric_update(self._series, "set", float(value)))

    def observe(self, value):
        """Counts `value` into a histogram."""
        _metrics(lambda: wire.metric_update(self._series, "observe", float(value)))

    def value(self):
        """A counter's or gauge's current value."""
        return _metrics(lambda: wire.metric_value(self._series))


def _metrics(call):
    try:
        return call()
    except wire.MetricError as e:
        raise TritonModelException(str(e)) from None


# --- auto_complete_config ---------------------------------------------------------------------


class ModelConfig:
    """The configuration `TritonPythonModel.auto_complete_config` receives and returns.

    As in Triton, only `max_batch_size`, inputs, outputs, dynamic batching and the decoupled
    policy can be completed, and what the configuration already says cannot be contradicted
    (each setter raises ValueError, naming the conflict). The server checks the result again.
    """

    def __init__(self, model_config):
        if isinstance(model_config, str):
            model_config = json.loads(model_config)
        self._model_config = model_config
        model_config.setdefault("input", [])
        model_config.setdefault("output", [])
        model_config.setdefault("max_batch_size", 0)

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict) -> None:  # noqa: A002 - Triton's parameter name
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict, allowed: tuple) -> None:
        name = tensor.get("name")
        where = f"in auto-complete-config function for model '{self._name()}'"
        for key in tensor:
            if key not in allowed:
                listed = ", ".join(f"'{k}'" for k in allowed)
                raise ValueError(f"{kind} '{name}' {where} contains property other than "
                                 f"{listed}.")
        if name is None:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{name}' {where} is missing '{key}' property.")
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            configured_type = current.get("data_type", "TYPE_INVALID")
            if configured_type not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{configured_type} for {kind} '{name}', model provides "
                    f"{tensor['data_type']}")
            configured_dims = current.get("dims") or []
            if configured_dims and list(configured_dims) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(configured_dims)}")
            if ("optional" in tensor and current.get("optional", False)
                    and current["optional"] != tensor["optional"]):
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if policy.get("decoupled", False) and not wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to 'True'.")
            policy["decoupled"] = wanted


def using_decoupled_model_transaction_policy(model_config) -> bool:
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# Triton's own module exposes these too; some model.py files use them through pb_utils.
__all__ = [name for name in dir() if not name.startswith("_")]
