"""The handler export that runs a Triton `model.py` (`class TritonPythonModel`) in Tessera.

`tessera build` makes the component of this module, `triton_python_backend_utils` and the
model's folder. componentize-py runs this module at build time and snapshots the interpreter:
only modules imported then exist at run time, so every module the model's source names is
imported here, even those it imports inside a function (`wire.preimport_named_modules`).

componentize-py makes a new `Handler` object per call, so the model lives in a module global.
One module serves both worlds: `Handler` for a model, `DecoupledHandler` for a decoupled model
(`model_transaction_policy { decoupled: true }`), whichever the component was built for, and
`ConfigCompletion` when the model.py has an `auto_complete_config` (the `completing-model`
world, which exports both handlers: the completed configuration says which one serves).

The sandbox has one thread. `threading.Thread.start` runs the thread's function at once, to its
end (Triton's decoupled examples send their responses from a thread they start in `execute`);
`join` then returns at once and `is_alive` is False. A decoupled `async def execute` runs in the
background instead, as in Triton (`tessera_loop.Background`): batches interleave while their
coroutines wait.
"""

import asyncio
import json
import threading
import traceback

import tessera_loop
import tessera_wire as wire
import triton_python_backend_utils as pb_utils
from componentize_py_types import Ok
from wit_world import exports
from wit_world.imports import types

import model as _user_module  # the model's model.py (its version folder is on the path)


wire.preimport_named_modules("model")


def _run_thread_inline(thread, *_args, **_kwargs):
    try:
        thread.run()
    except Exception as e:  # noqa: BLE001 - as an uncaught exception ends a thread: logged
        wire.log("error", f"thread {thread.name} failed: {type(e).__name__}: {e}\n"
                          f"{traceback.format_exc(limit=8)}")


threading.Thread.start = _run_thread_inline
threading.Thread.join = lambda thread, timeout=None: None
threading.Thread.is_alive = lambda thread: False

_model = None


def _initialize(config_json: str) -> None:
    global _model
    try:
        config = json.loads(config_json)
        pb_utils._declare_outputs(config)
        name = config.get("name", "")
        args = {
            "model_config": config_json,
            "model_instance_kind": "CPU",
            "model_instance_name": f"{name}_0",
            "model_instance_device_id": "0",
            # The sandbox has no repository folder; the model's files are in the
            # component (what the model's folder held at `tessera build`).
            "model_repository": "",
            "model_version": str(config.get("version", "")),
            "model_name": name,
        }
        model = _user_module.TritonPythonModel()
        if hasattr(model, "initialize"):
            model.initialize(args)
        _model = model
    except wire.USER_FAILURES as e:  # noqa: BLE001 - reported as the load error, with the trace
        raise wire.Err(f"initialize failed: {type(e).__name__}: {e}\n"
                       f"{traceback.format_exc(limit=8)}") from None


def _execute(pb_requests):
    """The model's `execute` (plain or async) on a batch; raises what it raises."""
    responses = _model.execute(pb_requests)
    if asyncio.iscoroutine(responses):
        responses = tessera_loop.run(responses)
    return responses


def _message(e: Exception) -> str:
    return str(e) if isinstance(e, pb_utils.TritonModelException) else f"{type(e).__name__}: {e}"


def _finalize() -> None:
    if _model is not None and hasattr(_model, "finalize"):
        try:
            _model.finalize()
        except Exception as e:  # noqa: BLE001 - nothing to fail any more; logged
            wire.log("error", f"finalize failed: {type(e).__name__}: {e}")


if hasattr(exports, "Handler"):  # the `model` world
    class Handler(exports.Handler):
        def initialize(self, config_json: str) -> None:
            _initialize(config_json)

        def execute(self, requests):
            wire_requests = [wire.WireRequest.from_wit(r) for r in requests]
            pb_requests = [pb_utils.InferenceRequest._from_wire(r) for r in wire_requests]
            try:
                responses = _execute(pb_requests)
            except wire.USER_FAILURES as e:  # noqa: BLE001 - Triton fails every request of the batch
                return [wire.Err(wire.error_to_wit("internal", _message(e))) for _ in requests]
            message = _not_one_per_request(responses, len(requests))
            if message is not None:
                return [wire.Err(wire.error_to_wit("internal", message)) for _ in requests]
            return [_to_wit(resp, req) for resp, req in zip(responses, wire_requests)]

        def finalize(self) -> None:
            _finalize()


if hasattr(exports, "DecoupledHandler"):  # the `decoupled-model` world
    class DecoupledHandler(exports.DecoupledHandler):
        """Triton's decoupled model: `execute` sends through each request's sender and returns
        None. Its response threads run within `execute` (see `_run_thread_inline`), so when
        `execute` returns, every stream the model did not end is ended with an error."""

        def initialize(self, config_json: str) -> None:
            _initialize(config_json)

        def execute(self, requests):
            pb_requests = []
            for request, sender in requests:
                wire_request = wire.WireRequest.from_wit(request)
                pb_request = pb_utils.InferenceRequest._from_wire(wire_request)
                pb_request._sender = pb_utils.InferenceResponseSender(
                    wire.WireSender(sender), wire_request.requested_outputs)
                pb_requests.append(pb_request)
            senders = [r._sender._sender for r in pb_requests]
            failure = None
            try:
                returned = _model.execute(pb_requests)
                if asyncio.iscoroutine(returned):
                    # As Triton: not awaited here; its streams go on in `resume`.
                    _background.start(returned, senders)
                    return
                if returned is not None:
                    failure = ("a decoupled model's execute must return None and send its "
                               "responses through request.get_response_sender()")
            except wire.USER_FAILURES as e:  # noqa: BLE001 - ends every open stream of the batch
                failure = _message(e)
            for sender in senders:
                tessera_loop.end_stream(sender, failure or tessera_loop.NO_FINAL)

        def resume(self):
            return _background.resume()

        def finalize(self) -> None:
            _background.close()
            _finalize()

    _background = tessera_loop.Background(wire.log, _message)


if hasattr(exports, "ConfigCompletion"):  # built for a model.py with auto_complete_config
    class ConfigCompletion(exports.ConfigCompletion):
        """Triton's `TritonPythonModel.auto_complete_config`, called on the class (a static
        method) once when the model loads, in an instance that is then dropped."""

        def complete_config(self, config_json: str) -> str:
            complete = getattr(_user_module.TritonPythonModel, "auto_complete_config", None)
            if complete is None:
                return config_json
            try:
                returned = complete(pb_utils.ModelConfig(config_json))
            except wire.USER_FAILURES as e:  # noqa: BLE001 - reported as the load error, with the trace
                raise wire.Err(f"{type(e).__name__}: {e}\n"
                               f"{traceback.format_exc(limit=8)}") from None
            if not isinstance(returned, pb_utils.ModelConfig):
                raise wire.Err(f"auto_complete_config returned a {type(returned).__name__}; it "
                               "must return the pb_utils.ModelConfig it was given")
            try:
                return json.dumps(returned.as_dict())
            except (TypeError, ValueError) as e:
                raise wire.Err(f"the completed configuration is not JSON: {e}") from None


def _not_one_per_request(responses, count: int):
    """Why `execute`'s return is not one response per request (None when it is)."""
    if not isinstance(responses, (list, tuple)):
        # Triton's stub: "Expected a list in the execute return".
        return (f"execute returned a {type(responses).__name__}; a model must return a list "
                "with one InferenceResponse per request")
    if len(responses) != count:
        return (f"execute returned {len(responses)} responses for {count} requests; "
                "a model must return one InferenceResponse per request")
    return None


def _to_wit(response, request: "wire.WireRequest"):
    if not isinstance(response, pb_utils.InferenceResponse):
        return wire.Err(wire.error_to_wit(
            "internal", f"execute returned a {type(response).__name__} "
                        "where an InferenceResponse is due"))
    if response.has_error():
        err = response.error()
        kind = pb_utils.ERROR_KINDS.get(err.code(), "internal")
        return wire.Err(wire.error_to_wit(kind, err.message()))
    wanted = set(request.requested_outputs)
    try:
        outputs = [pb_utils._wire_as_declared(t).to_wit() for t in response._outputs
                   if not wanted or t.name() in wanted]
        return Ok(types.Response(outputs, wire.parameters_to_wit(response._parameters)))
    except wire.USER_FAILURES as e:  # noqa: BLE001 - this response fails, not the instance
        return wire.Err(wire.error_to_wit("internal", f"the response could not be sent: {_message(e)}"))
