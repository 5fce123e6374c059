"""The producer's RecordFuture (client/producer/record_future.py) behaves as a concurrent.futures.Future
for everything a caller does with a send()'s future, whether it waits before or after the
record is settled, from another thread, through concurrent.futures.wait/as_completed."""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from concurrent.futures import TimeoutError as FutureTimeoutError

import pytest

from oncelog.client.producer.record_future import RecordFuture


def test_settled_before_anyone_looks():
    f = RecordFuture()
    assert not f.done()
    f.set_result(42)
    assert f.done() and f.result() == 42 and f.exception() is None
    assert "_condition" not in f.__dict__  # settled without one
    g = RecordFuture()
    error = ValueError("boom")
    g.set_exception(error)
    assert g.done() and g.exception() is error
    with pytest.raises(ValueError, match="boom"):
        g.result(0)
    assert isinstance(f, Future)
    assert "returned int" in repr(f)


def test_a_waiting_thread_is_woken():
    f = RecordFuture()
    got = []
    t = threading.Thread(target=lambda: got.append(f.result(10)))
    t.start()
    while "_condition" not in f.__dict__:  # the waiter made the condition
        threading.Event().wait(0.001)
    f.set_result("done")
    t.join(10)
    assert got == ["done"]


def test_a_wait_with_a_timeout_times_out_while_pending():
    f = RecordFuture()
    with pytest.raises(FutureTimeoutError):
        f.result(0.01)
    with pytest.raises(FutureTimeoutError):
        f.exception(0.01)
    f.set_exception(KeyError("k"))
    assert isinstance(f.exception(0), KeyError)


def test_callbacks_run_once_settled_and_at_once_after():
    f = RecordFuture()
    seen = []
    f.add_done_callback(lambda fut: seen.append(("before", fut.result())))
    f.set_result(7)
    f.add_done_callback(lambda fut: seen.append(("after", fut.result())))
    assert seen == [("before", 7), ("after", 7)]
    g = RecordFuture()
    g.add_done_callback(lambda fut: seen.append(("failed", type(fut.exception()))))
    g.set_exception(RuntimeError())
    assert seen[-1] == ("failed", RuntimeError)


def test_cannot_be_cancelled_nor_settled_twice():
    f = RecordFuture()
    assert not f.cancel() and not f.cancelled()
    f.set_result(1)
    with pytest.raises(Exception, match="FINISHED"):  # InvalidStateError, as Future's
        f.set_result(2)
    with pytest.raises(Exception, match="FINISHED"):
        f.set_exception(ValueError())
    assert f.result() == 1


def test_concurrent_futures_wait_and_as_completed():
    futures = [RecordFuture() for _ in range(5)]
    futures[3].set_result(3)  # settled before wait() looks: no condition
    done, not_done = wait(futures, timeout=0.01)
    assert done == {futures[3]} and len(not_done) == 4
    timer = threading.Timer(0.05, futures[1].set_result, (1,))
    timer.start()
    done, _ = wait([futures[0], futures[1]], timeout=10, return_when=FIRST_COMPLETED)
    assert done == {futures[1]}
    for i in (0, 2, 4):
        threading.Timer(0.01 * i, futures[i].set_result, (i,)).start()
    assert sorted(f.result() for f in as_completed(futures, timeout=10)) == [0, 1, 2, 3, 4]


def test_many_threads_race_settling_against_waiting():
    for _ in range(200):
        f = RecordFuture()
        results = []
        waiters = [threading.Thread(target=lambda f=f, out=results: out.append(f.result(10)))
                   for _ in range(3)]
        for w in waiters:
            w.start()
        f.set_result("x")
        for w in waiters:
            w.join(10)
        assert results == ["x"] * 3
