"""The handler export that runs a model.py written against the `tessera` module
(`class ...(tessera.Handler)`, `backend: "wasm"`).

`tessera build` makes the component of this module, `tessera` and the model's folder, for the
`model` world, or for `decoupled-model` when the config says `decoupled: true` (then `execute`
may yield responses: see `DecoupledHandler`).
componentize-py runs this module at build time and snapshots the interpreter, so the model's
handler class is found here, once: a model.py without exactly one fails the build, naming why.
componentize-py makes a new `Handler` object per call, so the instance lives in a module global.
"""

import json
import traceback
from collections.abc import Mapping

import tessera
import tessera_wire as wire
from componentize_py_types import Ok
from wit_world import exports
from wit_world.imports import types

import model as _user_module  # the model's model.py (its version folder is on the path)

wire.preimport_named_modules("model")


def _handler_class():
    found = [v for v in vars(_user_module).values()
             if isinstance(v, type) and issubclass(v, tessera.Handler) and v is not tessera.Handler
             and v.__module__ == _user_module.__name__]
    if len(found) != 1:
        names = ", ".join(sorted(c.__name__ for c in found)) or "none"
        raise TypeError(f"model.py must define exactly one class deriving from tessera.Handler "
                        f"(found: {names})")
    return found[0]


_HANDLER_CLASS = _handler_class()
_instance = None


def _initialize(config_json: str) -> None:
    global _instance
    try:
        instance = _HANDLER_CLASS()
        instance.initialize(json.loads(config_json))
        _instance = instance
    except Exception as e:  # noqa: BLE001 - reported as the load error, with the trace
        raise wire.Err(f"initialize failed: {type(e).__name__}: {e}\n"
                       f"{traceback.format_exc(limit=8)}") from None


def _finalize() -> None:
    if _instance is not None:
        try:
            _instance.finalize()
        except Exception as e:  # noqa: BLE001 - nothing to fail any more; logged
            wire.log("error", f"finalize failed: {type(e).__name__}: {e}")


if hasattr(exports, "Handler"):  # the `model` world
    class Handler(exports.Handler):
        def initialize(self, config_json: str) -> None:
            _initialize(config_json)

        def execute(self, requests):
            wire_requests = [wire.WireRequest.from_wit(r) for r in requests]
            batch = [tessera.Request._from_wire(r) for r in wire_requests]
            try:
                answers = _instance.execute_batch(batch)
            except tessera.Error as e:
                answers = [e] * len(batch)
            except Exception as e:  # noqa: BLE001 - an execute_batch of the user's own failed
                answers = [tessera.Internal(f"{type(e).__name__}: {e}")] * len(batch)
            if answers is None or len(answers) != len(batch):
                got = "None" if answers is None else str(len(answers))
                answers = [tessera.Internal(
                    f"execute_batch returned {got} answers for {len(batch)} requests")] * len(batch)
            return [_to_wit(tessera._answer(a), r) for a, r in zip(answers, wire_requests)]

        def finalize(self) -> None:
            _finalize()


if hasattr(exports, "DecoupledHandler"):  # the `decoupled-model` world
    class DecoupledHandler(exports.DecoupledHandler):
        """A streaming handler (`model_transaction_policy { decoupled: true }`): `execute`
        yields its responses, each sent as it comes; the stream ends when the generator does.
        A batch's requests stream one after another."""

        def initialize(self, config_json: str) -> None:
            _initialize(config_json)

        def execute(self, requests):
            for request, sender in requests:
                wire_request = wire.WireRequest.from_wit(request)
                _stream(tessera.Request._from_wire(wire_request), wire.WireSender(sender),
                        set(wire_request.requested_outputs))

        def resume(self):
            return None  # every stream ended within execute

        def finalize(self) -> None:
            _finalize()


def _stream(request, sender: "wire.WireSender", wanted: set) -> None:
    def send(answer, final: bool) -> None:
        if isinstance(answer, tessera.Error):
            sender.send_error(answer.kind, answer.message)
        else:
            outputs = [t._wire for t in answer.outputs if not wanted or t.name in wanted]
            sender.send(outputs, answer.parameters, final)

    produced = None
    try:
        produced = _instance.execute(request)
        if produced is None or isinstance(produced, (tessera.Response, Mapping)):
            send(tessera._answer(produced), final=True)  # one response: the stream's only one
            return
        for item in produced:
            answer = tessera._answer(item)
            send(answer, final=False)
            if isinstance(answer, tessera.Error):
                return  # an error ends the stream
        sender.finish()
    except wire.SendError:
        pass  # the caller has gone, or the stream ended: stop producing
    except tessera.Error as e:
        _end_with(sender, e.kind, e.message)
    except Exception as e:  # noqa: BLE001 - ends this request's stream only
        _end_with(sender, "internal", f"{type(e).__name__}: {e}")
    finally:
        close = getattr(produced, "close", None)
        if close is not None and not isinstance(produced, (tessera.Response, Mapping)):
            close()  # a generator stopped early runs its `finally` blocks now


def _end_with(sender: "wire.WireSender", kind: str, message: str) -> None:
    if not sender.final_sent:
        try:
            sender.send_error(kind, message)
        except wire.SendError:
            pass


def _to_wit(answer, request: "wire.WireRequest"):
    if isinstance(answer, tessera.Error):
        return wire.Err(wire.error_to_wit(answer.kind, answer.message))
    wanted = set(request.requested_outputs)
    outputs = [t._wire.to_wit() for t in answer.outputs if not wanted or t.name in wanted]
    return Ok(types.Response(outputs, wire.parameters_to_wit(answer.parameters)))
