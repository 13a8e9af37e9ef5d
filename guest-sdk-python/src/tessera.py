"""Tessera's Python API for new handlers: typed tensors, requests, errors with their status
codes, calls to other models, logging and custom metrics.

A handler is a class deriving from `tessera.Handler` in `<version>/model.py`, in a model whose
`config.pbtxt` says `backend: "wasm"`; `tessera build <model-dir>` makes the component::

    import numpy as np
    import tessera

    class AddSub(tessera.Handler):
        def execute(self, request: tessera.Request) -> tessera.Response:
            a = request.numpy("INPUT0")
            b = request.numpy("INPUT1")
            if a.shape != b.shape:
                raise tessera.InvalidInput("INPUT0 and INPUT1 differ in shape")
            return tessera.Response({"OUTPUT0": a + b, "OUTPUT1": a - b})

`execute` answers one request; a batch's requests are answered one by one, and an error
answers only the request that raised it. In a decoupled model `execute` may `yield` responses:
each is streamed to the caller as it comes. A handler that wants the whole batch at once defines
`execute_batch(requests)` instead. (Triton's `model.py` files with `TritonPythonModel` keep
`backend: "python"` and run on the `triton_python_backend_utils` shim.)
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

import tessera_wire as _wire

__all__ = [
    "Handler", "Request", "Response", "Tensor", "Error", "InvalidInput", "ModelNotFound",
    "ModelNotReady", "QuotaExceeded", "Timeout", "Internal", "infer", "log", "Metric", "counter",
    "gauge", "histogram",
]

_HAVE_NUMPY = not getattr(np, "__tessera_stand_in__", False)

# numpy's dtype name -> KServe datatype
_KSERVE_OF = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
    "uint64": "UINT64", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64", "object": "BYTES",
}


# --- errors -----------------------------------------------------------------------------------

class Error(Exception):
    """A request's failure, answered with the status its kind stands for. Raise a subclass;
    an exception of any other type answers 500 (internal) with its type and message."""

    kind = "internal"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(Error):
    """The request does not fit: names, datatypes, shapes, values (HTTP 400)."""
    kind = "invalid-input"


class ModelNotFound(Error):
    """No such model (HTTP 404); what `infer` raises for an unknown model."""
    kind = "model-not-found"


class ModelNotReady(Error):
    """The model exists but cannot serve now (HTTP 503)."""
    kind = "model-not-ready"


class QuotaExceeded(Error):
    """A limit of the caller was hit (HTTP 429)."""
    kind = "quota-exceeded"


class Timeout(Error):
    """A deadline passed (HTTP 503)."""
    kind = "timeout"


class Internal(Error):
    """Anything else (HTTP 500)."""
    kind = "internal"


_ERROR_OF_KIND = {cls.kind: cls for cls in
                  (InvalidInput, ModelNotFound, ModelNotReady, QuotaExceeded, Timeout, Internal)}


# --- tensors ----------------------------------------------------------------------------------

class Tensor:
    """A named tensor: `datatype` (KServe's name: FP32, INT64, BYTES, ...), `shape`, and its
    data as a numpy array (`numpy()`) or, for BYTES, as strings (`strings()`). A request's
    tensor passed on to `infer` or into a response is not copied."""

    __slots__ = ("_wire", "_array")

    def __init__(self, name: str, data: Any, datatype: str | None = None):
        """`data`: a numpy array, or a list of `str`/`bytes` (a BYTES tensor of that length).
        `datatype` converts the array (`Tensor("Y", x, "FP16")`)."""
        if isinstance(data, (list, tuple)) and all(isinstance(v, (str, bytes)) for v in data):
            elements = [v.encode() if isinstance(v, str) else v for v in data]
            self._wire = _wire.WireTensor(name, "BYTES", [len(elements)], elements=elements)
            self._array = None
            return
        if not isinstance(data, np.ndarray):
            raise TypeError(f"tensor '{name}': the data must be a numpy array or a list of "
                            f"strings, not {type(data).__name__}")
        if datatype is not None:
            if datatype not in _wire.NUMPY_NAMES:
                raise ValueError(f"tensor '{name}': unknown datatype '{datatype}'")
            data = data.astype(getattr(np, _wire.NUMPY_NAMES[datatype]))
        kserve = _datatype_of(data, name)
        self._wire = _wire.WireTensor.from_array(name, kserve, data, np)
        self._array = data

    @classmethod
    def _from_wire(cls, tensor: "_wire.WireTensor") -> "Tensor":
        t = cls.__new__(cls)
        t._wire, t._array = tensor, None
        return t

    @property
    def name(self) -> str:
        return self._wire.name

    @property
    def datatype(self) -> str:
        return self._wire.datatype

    @property
    def shape(self) -> list[int]:
        return list(self._wire.shape)

    def numpy(self):
        """The data as a numpy array of the tensor's datatype (BYTES: an object array of
        `bytes`)."""
        if self._array is None:
            self._array = self._wire.to_array(np)
        return self._array

    def strings(self) -> list[str]:
        """A BYTES tensor's elements as text (UTF-8), flattened; raises InvalidInput for
        another datatype or bytes that are not UTF-8."""
        if self.datatype != "BYTES":
            raise InvalidInput(f"tensor '{self.name}' is {self.datatype}, not BYTES")
        try:
            return [bytes(v).decode("utf-8") for v in self._wire.elements or []]
        except UnicodeDecodeError as e:
            raise InvalidInput(f"tensor '{self.name}' is not UTF-8 text: {e}") from None

    def renamed(self, name: str) -> "Tensor":
        return Tensor._from_wire(self._wire.renamed(name))

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.datatype}, shape={self.shape})"


def _datatype_of(array, name: str) -> str:
    dtype = array.dtype
    dname = dtype.name
    if _HAVE_NUMPY and dtype.kind in "SU":
        dname = "object"
    kserve = _KSERVE_OF.get({"bool_": "bool", "object_": "object"}.get(dname, dname))
    if kserve is None:
        raise TypeError(f"tensor '{name}': numpy type {dname} has no KServe datatype")
    return kserve


def _tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value if value.name == name else value.renamed(name)
    return Tensor(name, value)


# --- requests and responses ---------------------------------------------------------------------

class Request:
    """One inference request: its inputs by name, its parameters, the outputs it asks for."""

    __slots__ = ("id", "inputs", "parameters", "requested_outputs")

    def __init__(self, inputs: Mapping[str, Tensor], parameters: Mapping[str, Any] | None = None,
                 requested_outputs: Sequence[str] = (), id: str = ""):
        self.id = id
        self.inputs = dict(inputs)
        self.parameters = dict(parameters or {})
        self.requested_outputs = list(requested_outputs)

    @classmethod
    def _from_wire(cls, request: "_wire.WireRequest") -> "Request":
        return cls({t.name: Tensor._from_wire(t) for t in request.inputs}, request.parameters,
                   request.requested_outputs, request.id)

    def input(self, name: str) -> Tensor:
        """The input `name`; a request without it is answered 400 naming it."""
        try:
            return self.inputs[name]
        except KeyError:
            have = ", ".join(sorted(self.inputs)) or "none"
            raise InvalidInput(f"input '{name}' is missing (the request has: {have})") from None

    def numpy(self, name: str):
        """`input(name).numpy()`."""
        return self.input(name).numpy()

    def strings(self, name: str) -> list[str]:
        """`input(name).strings()`."""
        return self.input(name).strings()


class Response:
    """A request's answer: output tensors (a dict of name -> array, list of strings or Tensor,
    or a list of Tensors) and optional parameters. Outputs the request did not ask for are
    left out when it asked for some."""

    __slots__ = ("outputs", "parameters")

    def __init__(self, outputs: Mapping[str, Any] | Iterable[Tensor] = (),
                 parameters: Mapping[str, Any] | None = None):
        if isinstance(outputs, Mapping):
            self.outputs = [_tensor(name, value) for name, value in outputs.items()]
        else:
            self.outputs = [t if isinstance(t, Tensor) else _not_a_tensor(t) for t in outputs]
        self.parameters = dict(parameters or {})

    def __getitem__(self, name: str) -> Tensor:
        for t in self.outputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def numpy(self, name: str):
        return self[name].numpy()


def _not_a_tensor(value):
    raise TypeError(f"a response's outputs are Tensors or a dict, not {type(value).__name__}")


# --- calls to other models --------------------------------------------------------------------

def infer(model: str, inputs: Mapping[str, Any], outputs: Sequence[str] = (), *,
          version: int | None = None, parameters: Mapping[str, Any] | None = None,
          id: str = "") -> Response:
    """Calls another model through the server's queue (its batcher, its limits) and returns its
    response; a failure raises the matching `Error` subclass (`ModelNotFound` for an unknown
    model, ...), which, left uncaught, answers this request with the same status."""
    request = _wire.WireRequest(id, [_tensor(n, v)._wire for n, v in inputs.items()],
                                list(outputs), dict(parameters or {}))
    try:
        tensors, params = _wire.infer(model, version, request)
    except _wire.InferError as e:
        raise _ERROR_OF_KIND.get(e.kind, Internal)(e.message) from None
    return Response([Tensor._from_wire(t) for t in tensors], params)


# --- logging ----------------------------------------------------------------------------------

class _Log:
    """The server's log, tagged with the model's name (rate-limited by the host)."""

    @staticmethod
    def debug(message: str) -> None:
        _wire.log("debug", str(message))

    @staticmethod
    def info(message: str) -> None:
        _wire.log("info", str(message))

    @staticmethod
    def warn(message: str) -> None:
        _wire.log("warn", str(message))

    @staticmethod
    def error(message: str) -> None:
        _wire.log("error", str(message))


log = _Log()


# --- custom metrics ---------------------------------------------------------------------------

class Metric:
    """One series of a metric family on the server's `/metrics`, made by `counter`, `gauge` or
    `histogram`. It lives as long as this object: keep it on the handler (`self`). Misuse (a
    counter decremented, `set` on a counter) raises `Internal` saying what is wrong."""

    def __init__(self, series):
        self._series = series

    def increment(self, value: float = 1.0) -> None:
        _metric(lambda: _wire.metric_update(self._series, "increment", float(value)))

    def set(self, value: float) -> None:
        _metric(lambda: _wire.metric_update(self._series, "set", float(value)))

    def observe(self, value: float) -> None:
        _metric(lambda: _wire.metric_update(self._series, "observe", float(value)))

    def value(self) -> float:
        return _metric(lambda: _wire.metric_value(self._series))


def _metric(call):
    try:
        return call()
    except _wire.MetricError as e:
        raise Internal(str(e)) from None


def _series(name: str, description: str, kind: str, labels, buckets) -> Metric:
    pairs = [(str(k), str(v)) for k, v in (labels or {}).items()]
    family = _metric(lambda: _wire.metric_family(name, description, kind))
    return Metric(_metric(lambda: _wire.metric(family, pairs, buckets)))


def counter(name: str, description: str, labels: Mapping[str, str] | None = None) -> Metric:
    """The counter `name` with `labels` (a family shared by name across the server)."""
    return _series(name, description, "counter", labels, None)


def gauge(name: str, description: str, labels: Mapping[str, str] | None = None) -> Metric:
    """The gauge `name` with `labels`."""
    return _series(name, description, "gauge", labels, None)


def histogram(name: str, description: str, buckets: Sequence[float],
              labels: Mapping[str, str] | None = None) -> Metric:
    """The histogram `name` with `labels`, counting into `buckets` (upper bounds, increasing)."""
    return _series(name, description, "histogram", labels, [float(b) for b in buckets])


# --- the handler ------------------------------------------------------------------------------

class Handler:
    """Derive from this in model.py; one object serves one instance of the model."""

    def initialize(self, config: dict) -> None:
        """Called once when the instance loads, with the model's configuration (`config.pbtxt`
        as JSON: `name`, `input`, `output`, `parameters`...). An exception fails the load
        with its message."""

    def execute(self, request: Request) -> Response | Mapping[str, Any]:
        """Answers one request: a Response, or a dict of outputs. In a decoupled model
        (`model_transaction_policy { decoupled: true }`) it may be a generator: each response
        it yields is streamed as it comes, and the stream ends when it returns (or with the
        error it raises). A caller that goes away stops it at its next `yield`."""
        raise Internal(f"{type(self).__name__} defines neither execute nor execute_batch")

    def execute_batch(self, requests: list[Request]) -> list[Response | Error]:
        """Answers a batch: one Response (or dict, or Error) per request, in order. The default
        calls `execute` for each, so one request's error answers only that request."""
        answers = []
        for request in requests:
            try:
                answers.append(self.execute(request))
            except Error as e:
                answers.append(e)
            except Exception as e:  # noqa: BLE001 - answers this request only
                answers.append(Internal(f"{type(e).__name__}: {e}"))
        return answers

    def finalize(self) -> None:
        """Called when the instance unloads."""


def _answer(answer):
    """A handler's answer as a Response or an Error."""
    if isinstance(answer, (Response, Error)):
        return answer
    if isinstance(answer, Mapping):
        return Response(answer)
    return Internal(f"execute returned a {type(answer).__name__} where a Response or a dict "
                    "of outputs is due")
