"""A session's event queue: bounded, FIFO, and a reader cancelled after it was woken passes its turn on."""

from __future__ import annotations

import asyncio

import pytest

from usg.stream import EventQueue


def test_bounded_fifo_without_waiting() -> None:
    q = EventQueue(2)
    q.put_nowait({"n": 1})
    q.put_nowait({"n": 2})
    assert q.full() and q.qsize() == 2
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait({"n": 3})
    assert [q.get_nowait()["n"], q.get_nowait()["n"]] == [1, 2]
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()
    unbounded = EventQueue(0)
    for n in range(100):
        unbounded.put_nowait({"n": n})
    assert not unbounded.full() and unbounded.qsize() == 100


def test_readers_and_writers_wait_their_turn() -> None:
    async def run() -> tuple[list[int], int, bool, list[int], bool]:
        q = EventQueue(1)
        first, second = asyncio.create_task(q.get()), asyncio.create_task(q.get())
        await asyncio.sleep(0)
        q.put_nowait({"n": 1})
        await asyncio.sleep(0)
        q.put_nowait({"n": 2})
        in_order = [(await first)["n"], (await second)["n"]]
        # a reader woken for an event and cancelled before it ran passes the event to the next one
        woken, next_one = asyncio.create_task(q.get()), asyncio.create_task(q.get())
        await asyncio.sleep(0)
        q.put_nowait({"n": 3})
        woken.cancel()
        passed = (await asyncio.wait_for(next_one, 1))["n"]
        # a writer waits while the queue is full, and goes on once an event is read
        q.put_nowait({"n": 4})
        writer = asyncio.create_task(q.put({"n": 5}))
        await asyncio.sleep(0)
        blocked = not writer.done()
        order = [(await q.get())["n"]]
        await writer
        order.append((await q.get())["n"])
        return in_order, passed, woken.cancelled(), order, blocked

    in_order, passed, cancelled, order, blocked = asyncio.run(run())
    assert in_order == [1, 2]
    assert passed == 3 and cancelled
    assert order == [4, 5] and blocked
