"""Tensors, requests and calls between Python handlers and the host's WIT interfaces.

The one module that touches componentize-py's generated bindings (`wit_world`): everything
above it (`triton_python_backend_utils`, `tessera_handler`) works on these plain classes, so it
also runs, and is tested, on the host without the sandbox (`infer` and `log` are then set by the
test).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util

try:
    from componentize_py_types import Err
    from wit_world.imports import inference as _inference
    from wit_world.imports import log as _log
    from wit_world.imports import types as _types
except ImportError:  # on the host, in the shim's tests
    _inference = _log = _types = None

    class Err(Exception):  # type: ignore[no-redef]
        def __init__(self, value):
            super().__init__(value)
            self.value = value
try:  # only a decoupled model's world imports `streaming`
    from wit_world.imports import streaming as _streaming
except ImportError:
    _streaming = None
try:
    from wit_world.imports import metrics as _metrics
except ImportError:  # on the host, in the shim's tests (which set `_metrics` themselves)
    _metrics = None

# KServe datatype -> (numpy type name, bytes per element)
NUMPY_NAMES = {
    "BOOL": "bool_", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "object_",
}


def _is_real_numpy(np) -> bool:
    """numpy itself, not the sandbox's stand-in (which marks itself)."""
    return not getattr(np, "__tessera_stand_in__", False)


# What a model's code may raise that answers its request(s) with an error: anything. `sys.exit()`,
# `KeyboardInterrupt` and a bare `BaseException` are not `Exception`s; uncaught, they would trap
# the instance (losing its state), and the client would read only "unreachable instruction
# executed".
USER_FAILURES = (BaseException,)


class InferError(Exception):
    """An error the host answered a call with: its WIT kind (`invalid-input`, ...) and message."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


class WireTensor:
    """A tensor as the host sends it: raw little-endian bytes, or elements for BYTES."""

    __slots__ = ("name", "datatype", "shape", "raw", "elements", "_wit")

    def __init__(self, name, datatype, shape, raw=None, elements=None, wit=None):
        self.name, self.datatype, self.shape = name, datatype, list(shape)
        self.raw, self.elements, self._wit = raw, elements, wit

    def renamed(self, name: str) -> "WireTensor":
        return WireTensor(name, self.datatype, self.shape, self.raw, self.elements)

    @classmethod
    def from_array(cls, name, datatype, arr, np) -> "WireTensor":
        shape = [int(s) for s in arr.shape]
        if datatype == "BYTES":
            flat = arr.flatten() if hasattr(arr, "flatten") else arr
            elements = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
            return cls(name, datatype, shape, elements=elements)
        if _is_real_numpy(np):  # little-endian, contiguous
            arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        return cls(name, datatype, shape, raw=arr.tobytes())

    def to_array(self, np):
        name = NUMPY_NAMES[self.datatype]
        if self.datatype == "BYTES":
            values = list(self.elements or [])
            if _is_real_numpy(np):  # a 1-D object array, then shaped
                out = np.empty(len(values), dtype=np.object_)
                out[:] = values
                return out.reshape(self.shape)
            return np.array(values, dtype=np.object_).reshape(self.shape)
        if _is_real_numpy(np):  # a writable copy, as Triton's is writable
            dtype = np.dtype(getattr(np, name)).newbyteorder("<")
            return np.frombuffer(bytearray(self.raw or b""), dtype=dtype).reshape(self.shape)
        return np.ndarray.frombuffer(self.raw or b"", getattr(np, name), self.shape)

    # --- WIT ----------------------------------------------------------------------------------
    @classmethod
    def from_wit(cls, t) -> "WireTensor":
        data = t.data
        if isinstance(data, _types.TensorData_Raw):
            return cls(t.name, _DATATYPE_NAMES[t.datatype], t.shape, raw=data.value, wit=t)
        return cls(t.name, _DATATYPE_NAMES[t.datatype], t.shape, elements=data.value, wit=t)

    def to_wit(self):
        if self._wit is not None:
            return self._wit
        data = (_types.TensorData_Elements(list(self.elements)) if self.datatype == "BYTES"
                else _types.TensorData_Raw(bytes(self.raw)))
        return _types.Tensor(self.name, _types.Datatype[_WIT_DATATYPE[self.datatype]],
                             [int(s) for s in self.shape], data)


class WireRequest:
    __slots__ = ("id", "inputs", "requested_outputs", "parameters")

    def __init__(self, id, inputs, requested_outputs, parameters):
        self.id, self.inputs = id, list(inputs)
        self.requested_outputs, self.parameters = list(requested_outputs), dict(parameters)

    @classmethod
    def from_wit(cls, r) -> "WireRequest":
        return cls(r.id, [WireTensor.from_wit(t) for t in r.inputs], r.requested_outputs,
                   parameters_from_wit(r.parameters))

    def to_wit(self):
        return _types.Request(self.id, [t.to_wit() for t in self.inputs],
                              list(self.requested_outputs), parameters_to_wit(self.parameters))


_WIT_DATATYPE = {
    "BOOL": "BOOL", "UINT8": "UINT8", "UINT16": "UINT16", "UINT32": "UINT32",
    "UINT64": "UINT64", "INT8": "INT8", "INT16": "INT16", "INT32": "INT32", "INT64": "INT64",
    "FP16": "FP16", "FP32": "FP32", "FP64": "FP64", "BYTES": "BYTES",
}
_DATATYPE_NAMES = ({getattr(_types.Datatype, v): k for k, v in _WIT_DATATYPE.items()}
                   if _types is not None else {})


def parameters_from_wit(parameters) -> dict:
    return {p.key: p.value.value for p in parameters}


def parameters_to_wit(parameters: dict) -> list:
    out = []
    for key, value in parameters.items():
        if isinstance(value, bool):
            v = _types.ParameterValue_Bool(value)
        elif isinstance(value, int):
            v = _types.ParameterValue_Int(value)
        elif isinstance(value, float):
            v = _types.ParameterValue_Double(value)
        else:
            v = _types.ParameterValue_String(str(value))
        out.append(_types.Parameter(str(key), v))
    return out


def error_kind_name(kind) -> str:
    return kind.name.lower().replace("_", "-")


def infer(model: str, version, request: WireRequest):
    """Calls `model` through the server's queue (the WIT `infer`); returns the response's
    tensors and parameters, or raises `InferError`."""
    try:
        response = _inference.infer(model, version, request.to_wit())
    except Err as e:
        raise InferError(error_kind_name(e.value.kind), e.value.message) from None
    return ([WireTensor.from_wit(t) for t in response.outputs],
            parameters_from_wit(response.parameters))


def infer_stream(model: str, version, request: WireRequest):
    """Calls `model` through the server's queue and yields each of its responses as they come
    (the WIT `infer-stream`: every response of a decoupled model, the one of any other), as
    (tensors, parameters); an error raises `InferError` and ends it. Closing the generator
    early cancels the call."""
    try:
        stream = _inference.infer_stream(model, version, request.to_wit())
    except Err as e:
        raise InferError(error_kind_name(e.value.kind), e.value.message) from None
    with stream:
        while True:
            item = stream.next()
            if item is None:
                return
            if isinstance(item, Err):
                raise InferError(error_kind_name(item.value.kind), item.value.message)
            response = item.value
            yield ([WireTensor.from_wit(t) for t in response.outputs],
                   parameters_from_wit(response.parameters))


def log(level: str, message: str) -> None:
    _log.log(getattr(_log.Level, level.upper()), message)


class MetricError(Exception):
    """The host refused a metrics call; the message says why."""


def _metric_call(call):
    try:
        return call()
    except Err as e:
        raise MetricError(e.value) from None


def metric_family(name: str, description: str, kind: str):
    """The WIT `metrics.family` (kind: `counter`, `gauge` or `histogram`): the family's handle."""
    return _metric_call(
        lambda: _metrics.family(name, description, getattr(_metrics.MetricKind, kind.upper())))


def metric(family, labels: list, buckets) -> object:
    """The series of `family` with `labels` ((name, value) pairs): its handle."""
    return _metric_call(lambda: family.metric(labels, buckets))


def metric_update(series, operation: str, value: float) -> None:
    """`increment`, `set` or `observe` on a series."""
    _metric_call(lambda: getattr(series, operation)(value))


def metric_value(series) -> float:
    return _metric_call(series.value)


class SendError(Exception):
    """A send that did not go through: `cancelled` (the caller has gone), `closed` (the final
    response was sent already) or `too-large`."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


class WireSender:
    """The WIT `response-sender` of one request of a decoupled model (or, on the host, the
    object the test gives)."""

    __slots__ = ("_sender", "final_sent")

    def __init__(self, sender):
        self._sender, self.final_sent = sender, False

    def _check(self, result_of):
        try:
            result_of()
        except Err as e:
            raise SendError(error_kind_name(e.value)) from None

    def send(self, outputs: list, parameters: dict, final: bool) -> None:
        response = _types.Response([t.to_wit() for t in outputs], parameters_to_wit(parameters))
        self._check(lambda: self._sender.send(response, final))
        self.final_sent = self.final_sent or final

    def send_error(self, kind: str, message: str) -> None:
        self._check(lambda: self._sender.send_error(error_to_wit(kind, message)))
        self.final_sent = True

    def finish(self) -> None:
        self._check(self._sender.finish)
        self.final_sent = True

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())


def error_to_wit(kind: str, message: str):
    """The WIT `error` of a kind's name (`invalid-input`, ...)."""
    return _types.Error(_types.ErrorKind[kind.upper().replace("-", "_")], message)


def preimport_named_modules(module: str) -> None:
    """Imports every module `module`'s source names, those imported inside functions too.

    componentize-py runs the app module at build time and snapshots the interpreter: only
    modules imported then exist at run time."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # the model fails the same way when it reaches the import: reported then
