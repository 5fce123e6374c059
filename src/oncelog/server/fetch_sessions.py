"""Incremental fetch sessions (KIP-227), the part of Fetch that librdkafka and the Java client
use to avoid resending every partition on every fetch.

Session epoch -1 with id 0: a sessionless full fetch. Epoch 0: open a new session holding the
request's partitions (closing ``session_id`` if one is given). Epoch > 0: an incremental fetch
against the session: the request's partitions are added or updated, the forgotten ones removed,
and the response carries only partitions with news (records, a changed high watermark, last
stable offset or log start offset, or an error). Sans-IO: no clock or socket here.

Fetch v13+ names topics by id (KIP-516): a session opened by such a request keys its partitions
by (topic id, partition), one opened by an older request by (topic name, partition), and an
incremental request of the other kind is refused with FETCH_SESSION_TOPIC_ID_ERROR (Kafka's
FetchManager.newContext). A partition keyed by id stays in its session when its topic is
deleted: the handler answers it UNKNOWN_TOPIC_ID until the client forgets it, and a topic
re-created under the same name (a new id) is never served in its place.
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_SESSIONS = 1000  # Kafka's max.incremental.fetch.session.cache.slots

# A session partition: (topic name, partition) before Fetch v13, (topic id, partition) from v13.
TopicKey = str | uuid.UUID
SessionKey = tuple[TopicKey, int]


class FetchSessionError(Exception):
    def __init__(self, error_name: ErrorCode, message: str) -> None:
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
    partitions: OrderedDict[SessionKey, SessionPartition] = field(default_factory=OrderedDict)
    uses_topic_ids: bool = False


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
        requested: list[tuple[SessionKey, int, int]],
        forgotten: list[SessionKey],
        uses_topic_ids: bool = False,
    ) -> tuple[FetchSession, bool]:
        """Resolve a fetch request to its session.

        ``requested`` is ((topic, partition), fetch_offset, max_bytes) per partition, the
        topic a name or (``uses_topic_ids``, Fetch v13+) an id. Returns (session, full) where
        ``full`` says whether the response must list every partition; a sessionless fetch
        gets a session of id 0 that is not kept. Raises FetchSessionError for an unknown
        session id, a wrong epoch, or a request naming topics otherwise than its session.
        """
        if epoch == FINAL_EPOCH:
            self.sessions.pop(session_id, None)
            session = FetchSession(0, 0, uses_topic_ids=uses_topic_ids)
            for tp, off, mb in requested:
                session.partitions[tp] = SessionPartition(off, mb)
            return session, True
        if epoch == INITIAL_EPOCH:
            self.sessions.pop(session_id, None)
            while len(self.sessions) >= self.max_sessions:
                self.sessions.popitem(last=False)  # evict the least recently used
            session = FetchSession(self._new_id(), 1, uses_topic_ids=uses_topic_ids)
            for tp, off, mb in requested:
                session.partitions[tp] = SessionPartition(off, mb)
            self.sessions[session.session_id] = session
            return session, True
        found = self.sessions.get(session_id)
        if found is None:
            raise FetchSessionError(ErrorCode.fetch_session_id_not_found,
                                    f"fetch session {session_id} not found")
        session = found
        if epoch != session.next_epoch:
            raise FetchSessionError(ErrorCode.invalid_fetch_session_epoch,
                                    f"fetch session {session_id} expected epoch "
                                    f"{session.next_epoch}, got {epoch}")
        if session.uses_topic_ids != uses_topic_ids:
            raise FetchSessionError(ErrorCode.fetch_session_topic_id_error,
                                    f"fetch session {session_id} names topics by "
                                    f"{'id' if session.uses_topic_ids else 'name'}, the request "
                                    f"by {'id' if uses_topic_ids else 'name'}")
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
        """A deleted topic's partitions leave the sessions that name it (by name); those that
        know it by id keep them, to answer UNKNOWN_TOPIC_ID."""
        for s in self.sessions.values():
            for tp in [tp for tp in s.partitions if tp[0] == topic]:
                del s.partitions[tp]
