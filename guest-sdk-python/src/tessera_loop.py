"""asyncio in the sandbox, which has one thread and no sockets.

`run` runs a non-decoupled model's `async def execute` to its end within the call.

`Background` runs a decoupled model's coroutines across calls, as Triton's Python backend runs a
decoupled `async def execute`: the coroutine is started and the call returns once every
coroutine waits (on a timer, `asyncio.sleep`); the host calls `resume` when the soonest timer is
due, or sooner with the next batch, which starts while the others wait. So one instance
interleaves many streams, where a model that sends from threads (run inline here: the sandbox
has none) holds its instance to the end of each stream. A coroutine that blocks (`time.sleep`, a
BLS call) blocks the others meanwhile, as it blocks Triton's event loop.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import math
import time
import traceback

# How long one call runs ready coroutines before it hands the instance back, so new requests
# get in while a coroutine keeps being ready (`await asyncio.sleep(0)` in a loop).
SLICE_S = 0.010


class _NoSelector:
    """The sandbox has no sockets to wait on: a wait is only ever for a timer."""

    def select(self, timeout=None):
        if timeout:
            time.sleep(timeout)
        return []


class SandboxLoop(asyncio.base_events.BaseEventLoop):
    """An asyncio loop without a selector. asyncio's own loops open a socketpair to wake
    themselves, which WASI refuses; here nothing runs beside the loop, so nothing needs to wake
    it."""

    def __init__(self):
        super().__init__()
        self._selector = _NoSelector()

    def _process_events(self, event_list):
        pass

    def _write_to_self(self):
        pass

    def has_due_work(self) -> bool:
        """A callback is ready, or a timer is due."""
        return bool(self._ready) or bool(self._scheduled) and self._scheduled[0].when() <= self.time()

    def run_due(self, slice_s: float = SLICE_S) -> float | None:
        """Runs ready callbacks and due timers for up to `slice_s` (at least one pass), without
        waiting. Returns the seconds until there is work again: 0 when there still is, None
        when no timer is set."""
        end = self.time() + slice_s
        while self.has_due_work():
            # A stop scheduled first makes `run_forever` one pass that does not wait.
            self.call_soon(self.stop)
            self.run_forever()
            if self.time() >= end:
                break
        if self.has_due_work():
            return 0.0
        timers = [h.when() for h in self._scheduled if not h.cancelled()]
        return max(0.0, min(timers) - self.time()) if timers else None


def run(coroutine):
    """Runs a coroutine to its end on a fresh loop (time.sleep while only timers wait)."""
    loop = SandboxLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def end_stream(sender, message: str) -> None:
    """Ends a stream with an internal error, unless it has ended (`tessera_wire.WireSender`)."""
    if sender.final_sent:
        return
    try:
        sender.send_error("internal", message)
    except Exception:  # noqa: BLE001 - the caller has gone, or the stream has ended: nothing to end
        pass


NO_FINAL = ("execute returned before the final response was sent "
            "(send flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)")


class Background:
    """The coroutines a decoupled instance runs across calls, and the streams they answer."""

    def __init__(self, log, describe):
        self._log = log  # (level, message)
        self._describe = describe  # the error message a stream ends with, for an exception
        self._loop = None
        # The senders of each running batch coroutine.
        self._batches: dict = {}
        # Senders of batches whose coroutine returned: tasks it started may still answer them.
        self._returned: list = []

    def start(self, coroutine, senders: list) -> None:
        """Starts a batch's coroutine and runs the loop until every coroutine waits."""
        if self._loop is None:
            self._loop = SandboxLoop()
            self._loop.set_exception_handler(self._unhandled)
        task = self._loop.create_task(coroutine)
        self._batches[task] = senders
        task.add_done_callback(self._batch_done)
        self.resume()

    def resume(self) -> int | None:
        """Runs what is due; returns the milliseconds until there is work again, None when
        every coroutine has ended (the streams they left open are then ended with an error)."""
        if self._loop is None:
            return None
        after = self._loop.run_due()
        self._returned = [s for s in self._returned if not s.final_sent]
        if after is None:
            pending = asyncio.all_tasks(self._loop)
            message = NO_FINAL if not pending else (
                "every coroutine of the model waits with no timer set: nothing can wake it")
            open_streams = [s for senders in self._batches.values() for s in senders]
            open_streams += self._returned
            self._batches.clear()
            self._returned = []
            for task in pending:
                task.cancel()
            self._loop.run_due()  # their `finally` blocks
            for sender in open_streams:
                end_stream(sender, message)
            return None
        return math.ceil(after * 1000)

    def _batch_done(self, task) -> None:
        senders = self._batches.pop(task, [])
        if task.cancelled():
            return  # `resume` ends its streams
        error = task.exception()
        if error is None:
            self._returned.extend(senders)
            return
        trace = "".join(traceback.format_exception(error, limit=8))
        self._log("error", f"execute failed: {type(error).__name__}: {error}\n{trace}")
        message = self._describe(error)
        for sender in senders:
            end_stream(sender, message)

    def _unhandled(self, loop, context) -> None:
        error = context.get("exception")
        detail = f": {type(error).__name__}: {error}" if error is not None else ""
        self._log("error", f"{context.get('message', 'a coroutine failed')}{detail}")

    def close(self) -> None:
        if self._loop is not None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_due()
            self._loop.close()
            self._loop = None
