"""The Python guest's event loop (guest-sdk-python/src/tessera_loop.py), on the host: a decoupled
model's coroutines run across `execute` and `resume` calls, interleave while they wait, and leave
no stream open when they end. tests/python/test_python_models.py serves such a model for real."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "guest-sdk-python" / "src"))

import tessera_loop  # noqa: E402


class FakeSender:
    """What `tessera_wire.WireSender` offers the loop: sends recorded in one shared log."""

    def __init__(self, name: str, log: list):
        self.name, self.log, self.final_sent = name, log, False

    def send(self, value, final=False):
        assert not self.final_sent, f"{self.name}: a send after the final response"
        self.log.append((self.name, value))
        self.final_sent = final

    def send_error(self, kind, message):
        assert not self.final_sent, f"{self.name}: an error after the final response"
        self.log.append((self.name, f"{kind}: {message}"))
        self.final_sent = True


def background(logged=None):
    return tessera_loop.Background(lambda level, m: (logged if logged is not None else []).append(m),
                                   lambda e: f"{type(e).__name__}: {e}")


def drive(bg: tessera_loop.Background, limit_s: float = 5.0):
    """Calls `resume` as the host does, sleeping as long as it asks, until it returns None."""
    deadline = time.monotonic() + limit_s
    while (after := bg.resume()) is not None:
        assert time.monotonic() < deadline, "the coroutines did not end"
        time.sleep(after / 1000)


async def repeat(sender, words, pause_s):
    for word in words:
        await asyncio.sleep(pause_s)
        sender.send(word)
    sender.send("done", final=True)


def test_batches_interleave_while_their_coroutines_wait():
    log = []
    a, b = FakeSender("a", log), FakeSender("b", log)
    bg = background()
    bg.start(repeat(a, ["a1", "a2", "a3"], 0.05), [a])
    assert log == []  # it waits on its first sleep: execute returned
    after = bg.resume()
    assert after is not None and 0 < after <= 50
    bg.start(repeat(b, ["b1", "b2", "b3"], 0.05), [b])  # the next batch starts meanwhile
    drive(bg)
    assert [v for n, v in log if n == "a"] == ["a1", "a2", "a3", "done"]
    assert [v for n, v in log if n == "b"] == ["b1", "b2", "b3", "done"]
    order = [v for _, v in log]
    assert order.index("b1") < order.index("a3"), order  # b did not wait for a to end


def test_a_stream_left_open_is_ended_with_an_error_when_the_coroutines_end():
    log = []
    a = FakeSender("a", log)

    async def forgets_the_final(sender):
        sender.send("only")

    bg = background()
    bg.start(forgets_the_final(a), [a])
    assert bg.resume() is None
    assert log == [("a", "only"), ("a", "internal: " + tessera_loop.NO_FINAL)]


def test_a_task_the_batch_started_may_answer_after_the_batch_returned():
    log = []
    a = FakeSender("a", log)

    async def execute(sender):
        asyncio.get_running_loop().create_task(repeat(sender, ["late"], 0.02))

    bg = background()
    bg.start(execute(a), [a])
    drive(bg)
    assert log == [("a", "late"), ("a", "done")]


def test_a_failing_coroutine_ends_its_batch_streams_with_the_error_and_no_others():
    log, logged = [], []
    a, b, c = FakeSender("a", log), FakeSender("b", log), FakeSender("c", log)

    async def fails(sender):
        sender.send("first")
        await asyncio.sleep(0.01)
        raise ValueError("broken on purpose")

    bg = background(logged)
    bg.start(fails(a), [a, b])
    bg.start(repeat(c, ["c1"], 0.03), [c])
    drive(bg)
    assert ("a", "internal: ValueError: broken on purpose") in log
    assert ("b", "internal: ValueError: broken on purpose") in log
    assert [v for n, v in log if n == "c"] == ["c1", "done"]
    assert any("broken on purpose" in m for m in logged)


def test_coroutines_that_wait_on_nothing_are_cancelled_and_their_streams_ended():
    log = []
    a = FakeSender("a", log)
    cleaned = []

    async def waits_forever(sender):
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            cleaned.append(sender.name)

    bg = background()
    bg.start(waits_forever(a), [a])
    assert bg.resume() is None
    assert cleaned == ["a"]  # cancelled: its `finally` ran
    assert log == [("a", "internal: every coroutine of the model waits with no timer set: "
                          "nothing can wake it")]


def test_a_coroutine_that_never_waits_yields_the_instance_after_a_slice():
    log = []
    a = FakeSender("a", log)
    turns = []

    async def spins(sender):
        for i in range(100_000):
            turns.append(i)
            await asyncio.sleep(0)
        sender.send("done", final=True)

    bg = background()
    bg.start(spins(a), [a])
    assert bg.resume() == 0  # still ready: call again at once
    assert 0 < len(turns) < 100_000
    drive(bg, limit_s=60)
    assert log == [("a", "done")]


def test_run_awaits_a_coroutine_to_its_end_sleeping_through_timers():
    async def sums():
        await asyncio.sleep(0.01)
        return sum(await asyncio.gather(*(asyncio.sleep(0.01, result=i) for i in range(4))))

    assert tessera_loop.run(sums()) == 6
