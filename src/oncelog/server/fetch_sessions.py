"""Incremental fetch sessions (KIP-227), the part of Fetch that librdkafka and the Java client
use to avoid resending every partition on every fetch.

Session epoch -1 with id 0: a sessionless full fetch. Epoch 0: open a new session holding the
request's partitions (closing ``session_id`` if one is given). Epoch > 0: an incremental fetch
against the session: the request's partitions are added or updated, the forgotten ones removed,
and the response carries only partitions with news (records, a changed high watermark, last
stable offset or log start offset, or an error). Sans-IO: no clock or socket here.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_SESSIONS = 1000  # Kafka's max.incremental.fetch.session.cache.slots


class FetchSessionError(Exception):
    def __init__(self, error_name: str, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


@dataclass
class SessionPartition:
    fetch_offset: int
    max_bytes: int
    # What the client was last told, to decide whether an incremental response must include it.
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1


@dataclass
class FetchSession:
    session_id: int
    next_epoch: int
    partitions: OrderedDict[tuple[str, int], SessionPartition] = field(default_factory=OrderedDict)


class FetchSessionCache:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.max_sessions = max_sessions
        self._ids = itertools.count(1)

    def _new_id(self) -> int:
        while True:
            sid = next(self._ids) & 0x7FFFFFFF
            if sid and sid not in self.sessions:
                return sid

    def begin(
        self,
        session_id: int,
        epoch: int,
        requested: list[tuple[tuple[str, int], int, int]],
        forgotten: list[tuple[str, int]],
    ) -> tuple[FetchSession | None, bool]:
        """Resolve a fetch request to its session.

        ``requested`` is ((topic, partition), fetch_offset, max_bytes) per partition. Returns
        (session or None for a sessionless fetch, full) where ``full`` says whether the
        response must list every partition. Raises FetchSessionError for an unknown session
        id or a wrong epoch.
        """
        if epoch == FINAL_EPOCH:
            self.sessions.pop(session_id, None)
            session = FetchSession(0, 0)
            for tp, off, mb in requested:
                session.partitions[tp] = SessionPartition(off, mb)
            return session, True
        if epoch == INITIAL_EPOCH:
            self.sessions.pop(session_id, None)
            while len(self.sessions) >= self.max_sessions:
                self.sessions.popitem(last=False)  # evict the least recently used
            session = FetchSession(self._new_id(), 1)
            for tp, off, mb in requested:
                session.partitions[tp] = SessionPartition(off, mb)
            self.sessions[session.session_id] = session
            return session, True
        found = self.sessions.get(session_id)
        if found is None:
            raise FetchSessionError("fetch_session_id_not_found",
                                    f"fetch session {session_id} not found")
        session = found
        if epoch != session.next_epoch:
            raise FetchSessionError("invalid_fetch_session_epoch",
                                    f"fetch session {session_id} expected epoch "
                                    f"{session.next_epoch}, got {epoch}")
        self.sessions.move_to_end(session_id)
        session.next_epoch = 1 if session.next_epoch >= 0x7FFFFFFF else session.next_epoch + 1
        for tp in forgotten:
            session.partitions.pop(tp, None)
        for tp, off, mb in requested:
            sp = session.partitions.get(tp)
            if sp is None:
                session.partitions[tp] = SessionPartition(off, mb)
            else:
                sp.fetch_offset = off
                sp.max_bytes = mb
        return session, False

    def remove_topic(self, topic: str) -> None:
        for s in self.sessions.values():
            for tp in [tp for tp in s.partitions if tp[0] == topic]:
                del s.partitions[tp]
