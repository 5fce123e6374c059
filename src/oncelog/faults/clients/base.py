"""What the workloads (workload.py) ask of a client library: one consumer, one idempotent
(non-transactional) producer and one transactional producer, each adapter (ours, confluent-kafka)
turning its library's errors into ``OpError``: ``definite`` when the operation certainly did
not take effect (the history's ``fail``), otherwise indeterminate (``info``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .history import Key

Record = tuple[Key, int, Any]  # key, offset, value (an int, or the text if not one)
RebalanceLog = Callable[[str, list[Key]], None]  # ("assigned" | "revoked" | "lost", keys)


class OpError(Exception):
    """``definite``: the operation certainly did not take effect. ``reset``: the
    transactional producer is unusable (fenced, fatal, or its transaction's end unknown): the
    workload makes a new one with the same transactional.id (``txn_reset``)."""

    def __init__(self, message: str, definite: bool, reset: bool = False) -> None:
        super().__init__(message)
        self.definite = definite
        self.reset = reset


def decode_value(raw: bytes | None) -> Any:
    text = (raw or b"").decode(errors="replace")
    try:
        return int(text)
    except ValueError:
        return text


@dataclass
class Settings:
    """The flags an adapter needs (from the command line)."""

    bootstrap: str
    process: str
    transactional_id: str | None
    group: str | None
    request_timeout_ms: int
    transaction_timeout_ms: int
    session_timeout_ms: int
    op_timeout: float  # seconds an operation may take before it is given up (info)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        return cls(bootstrap=args.bootstrap, process=args.process,
                   transactional_id=args.transactional_id, group=args.group,
                   request_timeout_ms=args.request_timeout_ms,
                   transaction_timeout_ms=args.transaction_timeout_ms,
                   session_timeout_ms=args.session_timeout_ms, op_timeout=args.op_timeout)


class ClientAdapter:
    """One process's clients of one library. Consumer methods raise OpError for a failed
    request; producer methods raise OpError classified as above. An idempotent producer that
    failed fatally is replaced by the adapter itself; a transactional one when the workload
    asks (``txn_reset``, after an OpError with ``reset``)."""

    kind = ""

    def __init__(self, settings: Settings) -> None:
        self.s = settings

    # consumer (read_committed; in the group ``settings.group`` when there is one)
    def open_consumer(self, read_committed: bool = True) -> None:
        raise NotImplementedError

    def assign(self, keys: list[Key]) -> None:
        raise NotImplementedError

    def subscribe(self, topics: list[str], log: RebalanceLog) -> None:
        raise NotImplementedError

    def poll(self, timeout: float) -> list[Record]:
        raise NotImplementedError

    def assignment(self) -> list[Key]:
        raise NotImplementedError

    def position(self, k: Key) -> int:
        raise NotImplementedError

    def seek(self, k: Key, offset: int) -> None:
        raise NotImplementedError

    def seek_to_beginning(self, keys: list[Key]) -> None:
        raise NotImplementedError

    def committed(self, keys: list[Key]) -> dict[Key, int | None]:
        raise NotImplementedError

    def commit(self, offsets: dict[Key, int]) -> None:
        raise NotImplementedError

    def end_offsets(self, keys: list[Key]) -> dict[Key, int]:
        raise NotImplementedError

    # the idempotent producer
    def send(self, k: Key, value: int) -> int:
        raise NotImplementedError

    # the transactional producer
    def txn_init(self) -> dict[str, Any]:
        """init_transactions; what it negotiated (the client meta line's fields)."""
        raise NotImplementedError

    def txn_begin(self) -> None:
        raise NotImplementedError

    def txn_send(self, k: Key, value: int) -> Any:
        raise NotImplementedError

    def txn_send_offsets(self, offsets: dict[Key, int]) -> None:
        raise NotImplementedError

    def txn_flush(self, timeout: float) -> None:
        raise NotImplementedError

    def txn_commit(self) -> None:
        raise NotImplementedError

    def txn_abort(self) -> None:
        raise NotImplementedError

    def txn_offset(self, handle: Any) -> int:
        """The offset of a send of the committed transaction (-1 if the library does not
        tell)."""
        raise NotImplementedError

    def txn_reset(self) -> dict[str, Any]:
        """Close the transactional producer and make a new one with the same transactional.id
        (fencing the old epoch, aborting what it left open); its negotiated fields."""
        raise NotImplementedError

    def close(self) -> None:
        pass
