"""The transaction coordinator's state machine, sans IO (txn/): every transition and every error
the spec lists, driven with explicit times, no sockets and no sleeps; and the transaction-log
record format."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.txn.coordinator import (
    COMPLETE_RETRY_MS,
    Pause,
    SendMarkers,
    TransactionCoordinator,
    WriteTxnLog,
)
from oncelog.txn.log_format import (
    TxnLogFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from oncelog.txn.state import (
    VALID_PREVIOUS,
    IllegalTransitionError,
    TransactionMetadata,
    TransactionState,
)

S = TransactionState
T0 = 1_000_000
TP = ("t", 0)


class Harness:
    """The coordinator plus a pretend log and partitions that take every write at once."""

    def __init__(self, **kw) -> None:
        ids = itertools.count(1000)
        self.core = TransactionCoordinator(allocate_producer_id=lambda: next(ids),
                                           max_timeout_ms=kw.get("max_timeout_ms", 900_000),
                                           expiration_ms=kw.get("expiration_ms", 604_800_000),
                                           coordinator_epoch=kw.get("coordinator_epoch", 3),
                                           transaction_version=kw.get("transaction_version",
                                                                      2))
        self.core.load([])
        self.log: list[tuple[str, TransactionMetadata | None]] = []
        self.markers: list[SendMarkers] = []

    def run(self, effects, now=T0, markers_succeed=True):
        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, WriteTxnLog):
                self.log.append((e.transactional_id, e.metadata))
                queue.extend(self.core.write_done(e.transactional_id, True))
            else:
                self.markers.append(e)
                if markers_succeed:
                    queue.extend(self.core.markers_done(e.transactional_id, now))

    def call(self, method, *args, now=T0, markers_succeed=True, **kw):
        outcome = getattr(self.core, method)(*args, **kw)
        self.run(outcome.effects, now, markers_succeed)
        return outcome

    def init(self, txn="t1", timeout=60_000, now=T0, **kw):
        return self.call("init_producer_id", txn, timeout, now, now=now, **kw)

    def state(self, txn="t1"):
        return self.core.describe(txn)


def test_valid_previous_table_matches_kafkas():
    assert VALID_PREVIOUS[S.PREPARE_COMMIT] == {S.ONGOING}
    assert VALID_PREVIOUS[S.COMPLETE_ABORT] == {S.PREPARE_ABORT}
    # Kafka 4 (KIP-890 transaction version 2): an abort with nothing open bumps the epoch too.
    assert VALID_PREVIOUS[S.PREPARE_ABORT] == {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY,
                                               S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    m = TransactionMetadata("x", 1, 0, 1000, S.EMPTY)
    with pytest.raises(IllegalTransitionError):
        m.transition_to(S.PREPARE_COMMIT, 1)
    assert m.transition_to(S.ONGOING, 5).txn_last_update_ms == 5


def test_init_gives_a_new_id_then_bumps_the_epoch():
    h = Harness()
    first = h.init()
    assert (first.error, first.producer_epoch) == (None, 0)
    assert h.state().state == S.EMPTY and h.log[-1][1].producer_id == first.producer_id
    again = h.init()
    assert (again.producer_id, again.producer_epoch) == (first.producer_id, 1)


def test_timeout_above_the_maximum_is_refused():
    h = Harness(max_timeout_ms=10_000)
    assert h.init(timeout=10_001).error == ErrorCode.invalid_transaction_timeout
    assert h.init(timeout=0).error == ErrorCode.invalid_transaction_timeout
    assert h.init(timeout=10_000).error is None


def test_requests_wait_for_loading():
    core = TransactionCoordinator(allocate_producer_id=lambda: 1, max_timeout_ms=10_000,
                                  expiration_ms=10_000)
    assert core.init_producer_id("t", 1000, T0).error == ErrorCode.coordinator_load_in_progress
    assert core.end_txn("t", 1, 0, True, T0).error == ErrorCode.coordinator_load_in_progress


def test_commit_flow_writes_prepare_markers_then_complete():
    h = Harness()
    pid = h.init().producer_id
    assert h.call("add_partitions", "t1", pid, 0, [TP, ("t", 1)], T0 + 5).error is None
    assert h.state().state == S.ONGOING and h.state().txn_start_ms == T0 + 5
    # already in the transaction: no write
    writes = len(h.log)
    assert h.call("add_partitions", "t1", pid, 0, [TP], T0 + 6).error is None
    assert len(h.log) == writes
    assert h.call("end_txn", "t1", pid, 0, True, T0 + 10).error is None
    states = [m.state for _, m in h.log[writes:]]
    assert states == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
    (marker,) = h.markers
    assert (marker.commit, marker.partitions, marker.coordinator_epoch) == (
        True, frozenset({TP, ("t", 1)}), 3)
    # the completed transaction keeps its start time, as Kafka's does (kafka-transactions
    # describe shows it); InitProducerId clears it
    assert h.state().partitions == frozenset() and h.state().txn_start_ms == T0 + 5
    assert h.init(now=T0 + 20).error is None and h.state().txn_start_ms == -1


def test_end_txn_retries_and_wrong_ways():
    h = Harness()
    pid = h.init().producer_id
    assert h.call("end_txn", "t1", pid, 0, True, T0).error == ErrorCode.invalid_txn_state  # Empty
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    # markers not yet written: a retry is told to wait, the opposite is refused
    assert h.call("end_txn", "t1", pid, 0, False, T0, markers_succeed=False).error is None
    assert h.state().state == S.PREPARE_ABORT
    assert h.call("end_txn", "t1", pid, 0, False, T0).error == ErrorCode.concurrent_transactions
    assert h.call("end_txn", "t1", pid, 0, True, T0).error == ErrorCode.invalid_txn_state
    assert h.call("add_partitions", "t1", pid, 0, [TP], T0).error == ErrorCode.concurrent_transactions
    h.run(h.core.markers_done("t1", T0))
    assert h.state().state == S.COMPLETE_ABORT
    assert h.call("end_txn", "t1", pid, 0, False, T0).error is None  # retried: done
    assert h.call("end_txn", "t1", pid, 0, True, T0).error == ErrorCode.invalid_txn_state


def test_wrong_producer_id_or_epoch():
    h = Harness()
    pid = h.init().producer_id
    assert h.call("add_partitions", "t1", pid + 1, 0, [TP], T0).error == \
        ErrorCode.invalid_producer_id_mapping
    assert h.call("add_partitions", "nope", pid, 0, [TP], T0).error == \
        ErrorCode.invalid_producer_id_mapping
    assert h.call("add_partitions", "t1", pid, 1, [TP], T0).error == ErrorCode.producer_fenced
    assert h.call("add_partitions", "t1", pid, 1, [TP], T0, version=1).error == \
        ErrorCode.invalid_producer_epoch  # KIP-588: older clients get the older code
    assert h.call("end_txn", "t1", pid, 5, True, T0, version=1).error == ErrorCode.invalid_producer_epoch


def test_a_new_instance_fences_the_zombie_and_aborts_its_transaction():
    """spec 001, failure scenarios 2 and 3."""
    h = Harness()
    pid = h.init().producer_id
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    fencing = h.init()
    assert fencing.error == ErrorCode.concurrent_transactions  # the client retries...
    (marker,) = h.markers
    assert (marker.commit, marker.producer_epoch) == (False, 1)  # aborted with the new epoch
    assert h.state().state == S.COMPLETE_ABORT
    retried = h.init()
    assert (retried.error, retried.producer_id, retried.producer_epoch) == (None, pid, 2)
    # the zombie, still at epoch 0
    assert h.call("add_partitions", "t1", pid, 0, [TP], T0).error == ErrorCode.producer_fenced
    assert h.call("end_txn", "t1", pid, 0, True, T0).error == ErrorCode.producer_fenced


def test_kip360_recovery_with_the_current_id_and_epoch_is_not_fenced():
    h = Harness()
    pid = h.init().producer_id
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    h.call("end_txn", "t1", pid, 0, False, T0)  # the client aborted after an abortable error
    bumped = h.init(producer_id=pid, producer_epoch=0)
    assert (bumped.error, bumped.producer_id, bumped.producer_epoch) == (None, pid, 1)
    retry = h.init(producer_id=pid, producer_epoch=0)  # its response was lost: same answer
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (None, pid, 1)
    assert h.init(producer_id=pid, producer_epoch=7).error == ErrorCode.producer_fenced
    assert h.init(producer_id=pid + 9, producer_epoch=1).error == ErrorCode.producer_fenced
    assert h.init(producer_id=pid, producer_epoch=1, version=3).producer_epoch == 2


def test_epoch_exhaustion_allocates_a_new_producer_id():
    h = Harness()
    pid = h.init().producer_id
    h.core.transactions["t1"] = replace(h.state(), producer_epoch=32766)
    bumped = h.init()
    assert bumped.producer_id != pid and bumped.producer_epoch == 0
    assert h.state().last_producer_id == pid


@pytest.mark.parametrize("transaction_version", [1, 2])
def test_timed_out_transactions_are_aborted_with_a_bumped_epoch(transaction_version):
    h = Harness(transaction_version=transaction_version)
    pid = h.init(timeout=1000).producer_id
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    h.run(h.core.abort_timed_out(T0 + 1000))
    assert h.state().state == S.ONGOING  # not yet past
    h.run(h.core.abort_timed_out(T0 + 1001), now=T0 + 1001)
    assert h.state().state == S.COMPLETE_ABORT and h.state().producer_epoch == 1
    assert h.markers[-1].commit is False and h.markers[-1].producer_epoch == 1
    assert h.call("end_txn", "t1", pid, 0, True, T0).error == ErrorCode.producer_fenced
    retry = h.init(producer_id=pid, producer_epoch=0)
    if transaction_version < 2:
        # below transaction version 2 its own KIP-360 attempt to carry on is fenced too
        assert retry.error == ErrorCode.producer_fenced
    else:
        # at version 2 the abort keeps the epoch it held as the last one: Kafka 4.3 answers
        # its KIP-360 InitProducerId with the bumped epoch (the differential test's timeout
        # flow), and the transactional id is Empty at that epoch
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (None, pid, 1)
        assert (h.state().state, h.state().producer_epoch) == (S.EMPTY, 1)


def test_idle_transactional_ids_expire():
    h = Harness(expiration_ms=5000)
    pid = h.init().producer_id
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    h.run(h.core.expire(T0 + 10_000))
    assert h.state() is not None  # an ongoing transaction never expires
    h.call("end_txn", "t1", pid, 0, True, T0 + 10_000, now=T0 + 10_000)
    h.run(h.core.expire(T0 + 14_999))
    assert h.state() is not None
    h.run(h.core.expire(T0 + 15_000))
    assert h.state() is None and h.log[-1] == ("t1", None)


def test_replay_rolls_prepared_transactions_forward():
    h = Harness()
    pid = h.init().producer_id
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    h.call("end_txn", "t1", pid, 0, True, T0, markers_succeed=False)
    log_before_crash = list(h.log)
    h2 = Harness(coordinator_epoch=4)
    h2.core = TransactionCoordinator(allocate_producer_id=lambda: 1, max_timeout_ms=10_000,
                                     expiration_ms=10_000, coordinator_epoch=4)
    effects = h2.core.load(log_before_crash)
    assert [type(e) for e in effects] == [SendMarkers]
    assert effects[0].commit and effects[0].coordinator_epoch == 4
    h2.run(effects)
    assert h2.core.describe("t1").state == S.COMPLETE_COMMIT


def test_failed_log_write_changes_nothing():
    h = Harness()
    pid = h.init().producer_id
    outcome = h.core.add_partitions("t1", pid, 0, [TP], T0)
    assert h.core.add_partitions("t1", pid, 0, [TP], T0).error == ErrorCode.concurrent_transactions
    h.core.write_done("t1", False)
    assert h.state().state == S.EMPTY and outcome.error is None


@pytest.mark.parametrize("commit", [True, False])
def test_a_failed_completion_write_is_written_again(commit):
    """The markers are written but the CompleteCommit/CompleteAbort record is not (the
    transaction log's ISR fell below its minimum): the coordinator writes it again after a
    pause, and answers CONCURRENT_TRANSACTIONS meanwhile. Before, the transaction stayed
    prepared for ever and the transactional id could never be used again."""
    h = Harness()
    pid = h.init().producer_id
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    h.call("end_txn", "t1", pid, 0, commit, T0, markers_succeed=False)
    complete = h.core.markers_done("t1", T0 + 5)
    assert [type(e) for e in complete] == [WriteTxnLog]
    again = h.core.write_done("t1", False)
    assert again == [Pause(COMPLETE_RETRY_MS), complete[0]]
    prepared = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    assert h.state().state == prepared
    assert h.core.init_producer_id("t1", 60_000, T0 + 10).error == ErrorCode.concurrent_transactions
    assert h.core.write_done("t1", False) == again  # and again, while the log refuses it
    h.run([WriteTxnLog("t1", complete[0].metadata)])  # the write goes through this time
    assert h.state().state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert h.init(now=T0 + 20).error is None


def test_list_filters():
    h = Harness()
    a = h.init("a").producer_id
    h.init("b")
    h.call("add_partitions", "a", a, 0, [TP], T0)
    assert {m.transactional_id for m in h.core.list()} == {"a", "b"}
    assert [m.transactional_id for m in h.core.list({S.ONGOING})] == ["a"]
    assert [m.transactional_id for m in h.core.list(producer_ids={a})] == ["a"]
    assert [m.transactional_id for m in h.core.list(min_duration_ms=50, now_ms=T0 + 60)] == ["a"]
    assert h.core.list(min_duration_ms=50, now_ms=T0 + 10) == []


txn_ids = st.text(min_size=1, max_size=40)
topics = st.text(alphabet="abc-_.", min_size=1, max_size=20)


@given(txn_ids, st.integers(0, 2**62), st.integers(0, 32767), st.integers(1, 2**31 - 1),
       st.sampled_from(list(S)), st.frozensets(st.tuples(topics, st.integers(0, 1000))),
       st.integers(-1, 2**62), st.integers(-1, 2**62))
def test_log_record_round_trip(txn_id, pid, epoch, timeout, state, parts, start, updated):
    m = TransactionMetadata(txn_id, pid, epoch, timeout, state, parts, start, updated)
    assert decode_key(encode_key(txn_id)) == txn_id
    assert decode_value(txn_id, encode_value(m)) == m


def test_damaged_records_are_reported():
    m = TransactionMetadata("x", 1, 0, 1000, S.ONGOING, frozenset({TP}), 5, 6)
    value = encode_value(m)
    for bad in (value[:-1], value + b"\x00", b"\x00\x07" + value[2:]):
        with pytest.raises(TxnLogFormatError):
            decode_value("x", bad)
    with pytest.raises(TxnLogFormatError):
        decode_key(b"\x00\x00\x00\x09ab")


def test_init_producer_id_retried_while_its_fencing_abort_is_written_waits():
    """KIP-360: InitProducerId (its id and epoch) while its transaction is open aborts it at
    a bumped epoch; a retry that comes while the abort's markers are still written is
    CONCURRENT_TRANSACTIONS, as Kafka answers (the producer id checked, then a transition in
    progress, the epoch only then), not PRODUCER_FENCED; once written it gets the bumped
    epoch. The differential test met it on a loaded machine."""
    h = Harness()
    pid = h.init().producer_id
    h.call("add_partitions", "t1", pid, 0, [TP], T0)
    first = h.init(producer_id=pid, producer_epoch=0, markers_succeed=False)
    assert first.error == ErrorCode.concurrent_transactions
    assert h.state().state == S.PREPARE_ABORT
    assert h.init(producer_id=pid, producer_epoch=0).error == ErrorCode.concurrent_transactions
    assert h.init(producer_id=pid + 1, producer_epoch=0).error == ErrorCode.producer_fenced
    h.run(h.core.markers_done("t1", T0))
    retry = h.init(producer_id=pid, producer_epoch=0)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (None, pid, 1)
