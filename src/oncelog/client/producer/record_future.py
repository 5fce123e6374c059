"""The future ``Producer.send`` returns: a concurrent.futures.Future that costs one object.

A Future makes a Condition (with its RLock and deque) and two lists when it is created: six
objects the garbage collector tracks, for every record sent, most of them never used (a
caller seldom waits on each record). With a producer's futures alive by the hundred thousand,
the collector's passes over them cost more than the rest of ``send``. A RecordFuture makes
those parts when something first needs them (a wait, a callback, ``concurrent.futures.wait``);
settling a future that nobody waits on takes no Condition at all.

Everything else is Future's own code, unchanged: its methods reach the parts through the
attributes they always use (``_condition``, ``_waiters``, ``_done_callbacks``), which are
made here on first access. The one lock ``_MAKING`` orders making a condition against settling
without one, so that a waiter either finds the future settled or is notified.

A record cannot be taken back once queued (nor can a Java client's): ``cancel`` refuses.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, PENDING
from typing import Any

_MAKING = threading.Lock()


class RecordFuture(Future):
    def __init__(self) -> None:  # Future.__init__ would make the parts now
        self._state = PENDING
        self._result = None
        self._exception: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached while the attribute does not exist yet.
        if name == "_condition":
            with _MAKING:
                condition = self.__dict__.get("_condition")
                if condition is None:
                    condition = self.__dict__["_condition"] = threading.Condition()
            return condition
        if name in ("_waiters", "_done_callbacks"):
            # (used with the condition held, or, for the callbacks, once settled)
            return self.__dict__.setdefault(name, [])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _settle(self, result: Any, exception: BaseException | None) -> bool:
        """Settle without a condition if none was ever made (then nobody waits and no
        callback is attached: both make one); False if there is one to settle through."""
        with _MAKING:
            if "_condition" in self.__dict__:
                return False
            if self._state != PENDING:
                return False  # Future's own code raises InvalidStateError
            self._result = result
            self._exception = exception
            self._state = FINISHED
            return True

    def set_result(self, result: Any) -> None:
        if not self._settle(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._settle(None, exception):
            super().set_exception(exception)

    # Reads of a settled future need no lock: the state is set last, and never changes again.

    def done(self) -> bool:
        return self._state == FINISHED  # (never cancelled)

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED and self._exception is None:
            return self._result
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def cancel(self) -> bool:
        return False
