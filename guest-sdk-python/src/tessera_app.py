"""The handler export that runs a model.py written against the `tessera` module
(`class ...(tessera.Handler)`, `backend: "wasm"`).

`tessera build` makes the component of this module, `tessera` and the model's folder, for the
`model` world, or for `decoupled-model` when the config says `decoupled: true` (then `execute`
may yield responses, or be an async generator: see `DecoupledHandler`).
componentize-py runs this module at build time and snapshots the interpreter, so the model's
handler class is found here, once: a model.py without exactly one fails the build, naming why.
componentize-py makes a new `Handler` object per call, so the instance lives in a module global.
"""

import asyncio
import inspect
import json
import time
import traceback
from collections.abc import Mapping

import tessera
import tessera_loop
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
    except wire.USER_FAILURES as e:  # noqa: BLE001 - reported as the load error, with the trace
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
            except wire.USER_FAILURES as e:  # noqa: BLE001 - an execute_batch of the user's own failed
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
        The instance's streams take turns (see `_Streams`), so new requests join while others
        stream."""

        def initialize(self, config_json: str) -> None:
            _initialize(config_json)

        def execute(self, requests):
            for request, sender in requests:
                wire_request = wire.WireRequest.from_wit(request)
                _streams.start(tessera.Request._from_wire(wire_request), wire.WireSender(sender),
                               set(wire_request.requested_outputs))

        def resume(self):
            return _streams.turn()

        def finalize(self) -> None:
            _streams.close()
            _finalize()


class _Emitter:
    """Sends one stream's answers: a Response's outputs (those asked for), or an Error."""

    __slots__ = ("sender", "wanted")

    def __init__(self, sender: "wire.WireSender", wanted: set):
        self.sender, self.wanted = sender, wanted

    def send(self, answer, final: bool) -> None:
        if isinstance(answer, tessera.Error):
            self.sender.send_error(answer.kind, answer.message)
        else:
            outputs = [t._wire for t in answer.outputs if not self.wanted or t.name in self.wanted]
            self.sender.send(outputs, answer.parameters, final)


class _Streams:
    """The streams of a decoupled instance. Each call of `turn` advances every generator by one
    response, round after round, for up to `tessera_loop.SLICE_S`: streams interleave, and a
    long one does not hold the instance from the next request. An `async def` execute (an async
    generator, or a coroutine returning one answer) runs on the instance's event loop, so it may
    `await asyncio.sleep(...)` between responses without holding the instance."""

    def __init__(self):
        self._running = []  # (iterator, emitter)
        self._background = tessera_loop.Background(wire.log, _describe)

    def start(self, request, sender: "wire.WireSender", wanted: set) -> None:
        emitter = _Emitter(sender, wanted)
        try:
            produced = _instance.execute(request)
        except wire.USER_FAILURES as e:  # noqa: BLE001 - ends this request's stream only
            _end_with_exception(sender, e)
            return
        if inspect.isasyncgen(produced) or asyncio.iscoroutine(produced):
            self._background.start(_drain(produced, emitter), [sender])
        elif produced is None or isinstance(produced, (tessera.Response, Mapping)):
            try:  # one response: the stream's only one
                emitter.send(tessera._answer(produced), final=True)
            except wire.SendError:
                pass  # the caller has gone
        else:
            self._running.append((iter(produced), emitter))

    def turn(self):
        """Runs the streams' turns; when to call again (ms), None when nothing is left."""
        end = time.monotonic() + tessera_loop.SLICE_S
        while self._running and time.monotonic() < end:
            self._running = [s for s in self._running if _advance(*s)]
        after = self._background.resume()
        return 0 if self._running else after

    def close(self) -> None:
        for iterator, _ in self._running:
            _close(iterator)
        self._running = []
        self._background.close()


def _advance(iterator, emitter: _Emitter) -> bool:
    """Sends a generator's next response; False once its stream has ended."""
    try:
        answer = tessera._answer(next(iterator))
        emitter.send(answer, final=False)
        if not isinstance(answer, tessera.Error):
            return True  # an error ends the stream
    except StopIteration:
        try:
            emitter.sender.finish()
        except wire.SendError:
            pass
        return False
    except wire.SendError:
        pass  # the caller has gone, or the stream ended: stop producing
    except wire.USER_FAILURES as e:  # noqa: BLE001 - ends this request's stream only
        _end_with_exception(emitter.sender, e)
    _close(iterator)
    return False


async def _drain(produced, emitter: _Emitter) -> None:
    """Sends what an `async def` execute produces: each item of an async generator, or the one
    answer of a coroutine."""
    try:
        if asyncio.iscoroutine(produced):
            emitter.send(tessera._answer(await produced), final=True)
            return
        async for item in produced:
            answer = tessera._answer(item)
            emitter.send(answer, final=False)
            if isinstance(answer, tessera.Error):
                return
        emitter.sender.finish()
    except wire.SendError:
        pass
    except tessera.Error as e:
        _end_with(emitter.sender, e.kind, e.message)
    finally:
        if inspect.isasyncgen(produced):
            await produced.aclose()  # a generator stopped early runs its `finally` blocks now


def _close(iterator) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        try:
            close()  # a generator stopped early runs its `finally` blocks now
        except Exception as e:  # noqa: BLE001 - its stream has ended already; logged
            wire.log("error", f"closing the stream's generator failed: {_describe(e)}")


def _describe(e: Exception) -> str:
    return e.message if isinstance(e, tessera.Error) else f"{type(e).__name__}: {e}"


def _end_with_exception(sender: "wire.WireSender", e: Exception) -> None:
    if isinstance(e, tessera.Error):
        _end_with(sender, e.kind, e.message)
    else:
        _end_with(sender, "internal", f"{type(e).__name__}: {e}")


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


_streams = _Streams()  # a decoupled instance's streams (the instance lives in this module)
