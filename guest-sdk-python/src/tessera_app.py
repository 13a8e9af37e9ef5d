"""The handler export that runs a model.py written against the `tessera` module
(`class ...(tessera.Handler)`, `backend: "wasm"`).

`tessera build` makes the component of this module, `tessera` and the model's folder.
componentize-py runs this module at build time and snapshots the interpreter, so the model's
handler class is found here, once: a model.py without exactly one fails the build, naming why.
componentize-py makes a new `Handler` object per call, so the instance lives in a module global.
"""

import json
import traceback

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


class Handler(exports.Handler):
    def initialize(self, config_json: str) -> None:
        global _instance
        try:
            instance = _HANDLER_CLASS()
            instance.initialize(json.loads(config_json))
            _instance = instance
        except Exception as e:  # noqa: BLE001 - reported as the load error, with the trace
            raise wire.Err(f"initialize failed: {type(e).__name__}: {e}\n"
                           f"{traceback.format_exc(limit=8)}") from None

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
        if _instance is not None:
            try:
                _instance.finalize()
            except Exception as e:  # noqa: BLE001 - nothing to fail any more; logged
                wire.log("error", f"finalize failed: {type(e).__name__}: {e}")


def _to_wit(answer, request: "wire.WireRequest"):
    if isinstance(answer, tessera.Error):
        return wire.Err(wire.error_to_wit(answer.kind, answer.message))
    wanted = set(request.requested_outputs)
    outputs = [t._wire.to_wit() for t in answer.outputs if not wanted or t.name in wanted]
    return Ok(types.Response(outputs, wire.parameters_to_wit(answer.parameters)))
