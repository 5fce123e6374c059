"""Incremental fetch sessions (KIP-227), sans-IO."""

import uuid

import pytest
from kio.schema.errors import ErrorCode

from oncelog.server.fetch_sessions import FetchSessionCache, FetchSessionError


def test_sessionless_fetch_is_full_and_not_remembered():
    cache = FetchSessionCache()
    session, full = cache.begin(0, -1, [(("t", 0), 5, 100)], [])
    assert full and session.session_id == 0 and not cache.sessions


def test_new_session_then_incremental_updates_and_forgets():
    cache = FetchSessionCache()
    s, full = cache.begin(0, 0, [(("t", 0), 0, 100), (("t", 1), 0, 100)], [])
    assert full and s.session_id > 0 and s.next_epoch == 1
    s2, full = cache.begin(s.session_id, 1, [(("t", 0), 7, 50), (("u", 0), 3, 10)], [("t", 1)])
    assert s2 is s and not full
    assert {tp: (p.fetch_offset, p.max_bytes) for tp, p in s.partitions.items()} == {
        ("t", 0): (7, 50), ("u", 0): (3, 10)}
    assert s.next_epoch == 2


def test_wrong_epoch_and_unknown_session_are_errors():
    cache = FetchSessionCache()
    s, _ = cache.begin(0, 0, [(("t", 0), 0, 100)], [])
    with pytest.raises(FetchSessionError) as e:
        cache.begin(s.session_id, 5, [], [])
    assert e.value.error_name == ErrorCode.invalid_fetch_session_epoch
    with pytest.raises(FetchSessionError) as e:
        cache.begin(12345, 1, [], [])
    assert e.value.error_name == ErrorCode.fetch_session_id_not_found


def test_final_epoch_closes_the_session():
    cache = FetchSessionCache()
    s, _ = cache.begin(0, 0, [(("t", 0), 0, 100)], [])
    cache.begin(s.session_id, -1, [(("t", 0), 0, 100)], [])
    assert s.session_id not in cache.sessions


def test_cache_evicts_least_recently_used():
    cache = FetchSessionCache(max_sessions=2)
    a, _ = cache.begin(0, 0, [], [])
    b, _ = cache.begin(0, 0, [], [])
    cache.begin(a.session_id, 1, [], [])  # a is now the most recent
    c, _ = cache.begin(0, 0, [], [])
    assert set(cache.sessions) == {a.session_id, c.session_id}
    assert b.session_id not in cache.sessions


def test_a_session_keeps_the_kind_of_topic_names_it_was_opened_with():
    """KIP-516: a session opened by Fetch v13+ names topics by id, an older one by name; an
    incremental request of the other kind is FETCH_SESSION_TOPIC_ID_ERROR (after the epoch
    check), and the session is left as it was."""
    tid = uuid.uuid4()
    cache = FetchSessionCache()
    by_id, _ = cache.begin(0, 0, [((tid, 0), 0, 100)], [], uses_topic_ids=True)
    by_name, _ = cache.begin(0, 0, [(("t", 0), 0, 100)], [])
    for s, ids in ((by_id, False), (by_name, True)):
        with pytest.raises(FetchSessionError) as e:
            cache.begin(s.session_id, 1, [], [], uses_topic_ids=ids)
        assert e.value.error_name == ErrorCode.fetch_session_topic_id_error
        assert s.next_epoch == 1
        with pytest.raises(FetchSessionError) as e:
            cache.begin(s.session_id, 7, [], [], uses_topic_ids=ids)
        assert e.value.error_name == ErrorCode.invalid_fetch_session_epoch
    s, full = cache.begin(by_id.session_id, 1, [], [(tid, 0)], uses_topic_ids=True)
    assert not full and not s.partitions


def test_deleting_a_topic_drops_it_from_sessions_by_name_only():
    """A session by id keeps the deleted topic's partitions, which the handler then answers
    UNKNOWN_TOPIC_ID: the topic re-created under the same name has another id."""
    tid = uuid.uuid4()
    cache = FetchSessionCache()
    by_id, _ = cache.begin(0, 0, [((tid, 0), 3, 100)], [], uses_topic_ids=True)
    by_name, _ = cache.begin(0, 0, [(("t", 0), 3, 100), (("u", 0), 0, 100)], [])
    cache.remove_topic("t")
    assert list(by_name.partitions) == [("u", 0)]
    assert list(by_id.partitions) == [(tid, 0)]
