"""KIP-890 transaction version 2 and KIP-939 two-phase commit in the sans-IO transaction
coordinator (txn/): the epoch bump on every EndTxn, the overflow to a new producer id and the
retries that must not fence themselves, aborts with nothing open, verification, prepared
transactions kept across restarts (and a crash loop of them), no timeout for 2PC; and the
flexible transaction-log record that carries the extra ids."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.txn.coordinator import SendMarkers, TransactionCoordinator, WriteTxnLog
from oncelog.txn.log_format import decode_value, encode_value
from oncelog.txn.state import MAX_PRODUCER_EPOCH, TransactionMetadata, TransactionState

S = TransactionState
T0 = 1_000_000
TP = ("t", 0)
MAX = MAX_PRODUCER_EPOCH


class Harness:
    def __init__(self, two_phase=False, first_id=1000):
        ids = itertools.count(first_id)
        self.core = TransactionCoordinator(allocate_producer_id=lambda: next(ids),
                                           max_timeout_ms=900_000, expiration_ms=10**9,
                                           coordinator_epoch=1,
                                           two_phase_commit_enabled=two_phase)
        self.core.load([])
        self.markers: list[SendMarkers] = []
        self.hold_markers = False

    def run(self, effects, now=T0):
        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, WriteTxnLog):
                queue.extend(self.core.write_done(e.transactional_id, True))
            else:
                self.markers.append(e)
                if not self.hold_markers:
                    queue.extend(self.core.markers_done(e.transactional_id, now))

    def call(self, method, *args, now=T0, **kw):
        outcome = getattr(self.core, method)(*args, **kw)
        self.run(outcome.effects, now)
        return outcome

    def init(self, txn="t1", **kw):
        return self.call("init_producer_id", txn, 60_000, T0, **kw)

    def add(self, pid, epoch, txn="t1", **kw):
        return self.call("add_partitions", txn, pid, epoch, [TP], T0, **kw)

    def end(self, pid, epoch, commit=True, txn="t1"):
        return self.call("end_txn", txn, pid, epoch, commit, T0, version=5, txn_version=2)

    def state(self, txn="t1"):
        return self.core.describe(txn)

    def set_epoch(self, epoch, txn="t1"):
        self.core.transactions[txn] = replace(self.state(txn), producer_epoch=epoch)


def test_every_commit_and_abort_bumps_the_epoch():
    h = Harness()
    o = h.init()
    pid, epoch = o.producer_id, o.producer_epoch
    for commit in (True, False, True):
        assert h.add(pid, epoch).error is None
        o = h.end(pid, epoch, commit)
        assert o.error is None and (o.producer_id, o.producer_epoch) == (pid, epoch + 1)
        # The markers carry the bumped epoch: a late batch of the old one is fenced by them.
        assert (h.markers[-1].producer_id, h.markers[-1].producer_epoch) == (pid, epoch + 1)
        m = h.state()
        assert m.state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
        assert (m.producer_id, m.producer_epoch) == (pid, epoch + 1)
        assert m.client_txn_version == 2
        epoch += 1
    # The old epoch is fenced everywhere at the coordinator.
    assert h.add(pid, epoch - 1).error == ErrorCode.producer_fenced


def test_a_retried_end_txn_is_answered_not_fenced():
    h = Harness()
    o = h.init()
    pid = o.producer_id
    h.add(pid, 0)
    h.hold_markers = True
    first = h.end(pid, 0)
    assert (first.producer_id, first.producer_epoch) == (pid, 1)
    # While the markers are written: retry later; the other way is refused.
    assert h.end(pid, 0).error == ErrorCode.concurrent_transactions
    h.hold_markers = False
    h.run(h.core.markers_done("t1", T0))
    again = h.end(pid, 0)
    assert again.error is None and (again.producer_id, again.producer_epoch) == (pid, 1)
    assert h.end(pid, 0, commit=False).error == ErrorCode.producer_fenced
    assert h.state().state == S.COMPLETE_COMMIT


def test_epoch_overflow_hands_out_a_new_producer_id_and_retries_still_work():
    h = Harness()
    pid = h.init().producer_id
    h.set_epoch(MAX - 1)
    h.add(pid, MAX - 1)
    o = h.end(pid, MAX - 1)
    new_pid = o.producer_id
    assert new_pid != pid and o.producer_epoch == 0
    # The markers were written with the old id at the maximum epoch.
    assert (h.markers[-1].producer_id, h.markers[-1].producer_epoch) == (pid, MAX)
    m = h.state()
    assert (m.producer_id, m.producer_epoch, m.last_producer_id) == (new_pid, 0, pid)
    assert m.next_producer_id == -1
    # The client lost the answer and retries with the old id and epoch: same answer.
    retry = h.end(pid, MAX - 1)
    assert retry.error is None and (retry.producer_id, retry.producer_epoch) == (new_pid, 0)
    # And the new id works.
    assert h.add(new_pid, 0).error is None
    assert h.end(new_pid, 0).producer_epoch == 1


def test_an_abort_with_nothing_open_still_bumps_the_epoch():
    h = Harness()
    pid = h.init().producer_id
    o = h.end(pid, 0, commit=False)
    assert o.error is None and o.producer_epoch == 1
    assert h.state().state == S.COMPLETE_ABORT
    assert all(not m.partitions for m in h.markers)  # no partition to write a marker to
    assert h.end(pid, 1, commit=True).error == ErrorCode.invalid_txn_state


def test_old_protocol_end_txn_keeps_the_epoch():
    h = Harness()
    pid = h.init().producer_id
    h.add(pid, 0)
    o = h.call("end_txn", "t1", pid, 0, True, T0, version=3, txn_version=1)
    assert o.error is None and h.state().producer_epoch == 0
    assert h.markers[-1].producer_epoch == 0 and h.state().client_txn_version == 1


def test_partitions_added_by_the_leader_are_tagged_version_2():
    h = Harness()
    pid = h.init().producer_id
    assert h.add(pid, 0, txn_version=2).error is None
    assert h.state().client_txn_version == 2 and h.state().state == S.ONGOING


def test_verify_only_checks_the_transaction_without_changing_it():
    h = Harness()
    pid = h.init().producer_id
    core = h.core
    assert core.verify_partitions("t1", pid, 0, [TP]) == {TP: ErrorCode.invalid_txn_state}
    h.add(pid, 0)
    assert core.verify_partitions("t1", pid, 0, [TP, ("t", 1)]) == {
        TP: None, ("t", 1): ErrorCode.invalid_txn_state}
    assert core.verify_partitions("t1", pid, 1, [TP]) == {TP: ErrorCode.producer_fenced}
    assert core.verify_partitions("t1", pid + 1, 0, [TP]) == {
        TP: ErrorCode.invalid_producer_id_mapping}
    assert core.verify_partitions("nobody", pid, 0, [TP]) == {
        TP: ErrorCode.invalid_producer_id_mapping}
    h.end(pid, 0)
    assert core.verify_partitions("t1", pid, 1, [TP]) == {TP: ErrorCode.invalid_txn_state}
    assert h.state().state == S.COMPLETE_COMMIT


# -- KIP-939 ---------------------------------------------------------------------------------


def test_two_phase_commit_needs_the_broker_setting():
    assert Harness(two_phase=False).init(enable_2pc=True).error == \
        ErrorCode.transactional_id_authorization_failed
    h = Harness(two_phase=True)
    o = h.init(enable_2pc=True)
    assert o.error is None and h.state().txn_timeout_ms == 2**31 - 1 and h.state().two_phase


def test_two_phase_transactions_never_time_out():
    h = Harness(two_phase=True)
    pid = h.init(enable_2pc=True).producer_id
    h.add(pid, 0)
    assert h.core.abort_timed_out(T0 + 10**10) == []
    assert h.core.longest_open_ms(T0 + 5000) == 5000


def test_keep_prepared_txn_survives_a_crash_loop_and_fences_each_incarnation():
    h = Harness(two_phase=True)
    pid = h.init(enable_2pc=True).producer_id
    h.add(pid, 0)  # the transaction (pid, 0) is prepared by the client, which then dies
    identities = []
    for _ in range(4):
        o = h.init(enable_2pc=True, keep_prepared_txn=True)
        assert o.error is None
        assert (o.ongoing_producer_id, o.ongoing_producer_epoch) == (pid, 0)
        identities.append((o.producer_id, o.producer_epoch))
        assert h.state().state == S.ONGOING and TP in h.state().partitions
    assert identities == [(pid, 1), (pid, 2), (pid, 3), (pid, 4)]
    # Every earlier incarnation is fenced; the transaction itself takes nothing more.
    for old in [(pid, 0)] + identities[:-1]:
        assert h.end(*old).error == ErrorCode.producer_fenced
    assert h.add(*identities[-1]).error == ErrorCode.producer_fenced
    # The last one commits: markers with the transaction's own id and epoch + 1.
    o = h.end(*identities[-1])
    assert o.error is None and (o.producer_id, o.producer_epoch) == (pid, 5)
    assert (h.markers[-1].producer_id, h.markers[-1].producer_epoch) == (pid, 1)
    assert h.markers[-1].commit
    assert h.state().state == S.COMPLETE_COMMIT


def test_keep_prepared_txn_with_epoch_overflow_uses_a_next_producer_id():
    h = Harness(two_phase=True)
    pid = h.init(enable_2pc=True).producer_id
    h.set_epoch(MAX - 1)
    h.add(pid, MAX - 1)
    o = h.init(enable_2pc=True, keep_prepared_txn=True)
    next_pid = o.producer_id
    assert next_pid != pid and o.producer_epoch == 0
    assert (o.ongoing_producer_id, o.ongoing_producer_epoch) == (pid, MAX - 1)
    o2 = h.init(enable_2pc=True, keep_prepared_txn=True)
    assert (o2.producer_id, o2.producer_epoch) == (next_pid, 1)
    done = h.end(next_pid, 1, commit=False)
    assert done.error is None and (done.producer_id, done.producer_epoch) == (next_pid, 2)
    assert (h.markers[-1].producer_id, h.markers[-1].producer_epoch) == (pid, MAX)
    assert not h.markers[-1].commit
    # A lost answer: the retry with the identity it used is answered the same.
    assert (h.end(next_pid, 1, commit=False).producer_id,
            h.end(next_pid, 1, commit=False).producer_epoch) == (next_pid, 2)


def test_without_keep_prepared_the_transaction_is_aborted_as_before():
    h = Harness(two_phase=True)
    pid = h.init(enable_2pc=True).producer_id
    h.add(pid, 0)
    o = h.init(enable_2pc=True)
    assert o.error == ErrorCode.concurrent_transactions  # fencing: the abort is under way
    assert h.state().state == S.COMPLETE_ABORT
    assert (h.markers[-1].producer_epoch, h.markers[-1].commit) == (1, False)
    again = h.init(enable_2pc=True)
    assert again.error is None and again.producer_epoch == 2
    # keep_prepared_txn with nothing open: no transaction to report.
    kept = h.init(enable_2pc=True, keep_prepared_txn=True)
    assert kept.error is None and kept.ongoing_producer_id == -1


# -- the flexible record ----------------------------------------------------------------------


@given(st.integers(0, 2**62), st.integers(0, MAX), st.sampled_from(list(S)),
       st.frozensets(st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 1000)),
                     max_size=6),
       st.integers(-1, 2**62), st.integers(-1, 2**62), st.integers(-1, MAX),
       st.integers(-1, MAX), st.integers(0, 2), st.sampled_from([-1, 60_000]))
def test_flexible_record_round_trip(pid, epoch, state, parts, last_pid, next_pid, last_epoch,
                                    next_epoch, tv, timeout):
    m = TransactionMetadata("txn-é", pid, epoch, timeout, state, parts, 5, 7,
                            last_producer_id=last_pid, last_producer_epoch=last_epoch,
                            next_producer_id=next_pid, next_producer_epoch=next_epoch,
                            client_txn_version=tv)
    data = encode_value(m, 1)
    assert data[:2] == b"\x00\x01"
    assert decode_value("txn-é", data) == m


def test_flexible_record_skips_unknown_tags_and_version_0_drops_the_extras():
    m = TransactionMetadata("x", 5, 6, 1000, S.ONGOING, frozenset({("a", 1)}), 1, 2,
                            last_producer_id=4, next_producer_id=9, client_txn_version=2)
    data = bytearray(encode_value(m, 1))
    # Rewrite the final tagged-field section with an extra unknown tag (99, 3 bytes).
    count_pos = len(data) - 1 - sum(2 + n for n in (8, 8, 2))
    assert data[count_pos] == 3
    data[count_pos] = 4
    data += b"\x63\x03abc"
    assert decode_value("x", bytes(data)) == m
    old = decode_value("x", encode_value(m, 0))
    assert (old.last_producer_id, old.next_producer_id, old.client_txn_version) == (-1, -1, 0)
    with pytest.raises(Exception, match="transaction log value"):
        decode_value("x", encode_value(m, 1)[:-3])


def test_a_restarted_coordinator_finishes_an_overflowing_commit_and_answers_its_retry():
    """PrepareCommit with NextProducerId in the log (the coordinator died before the markers):
    the next coordinator rolls it forward and still recognises the client's retry."""
    h = Harness()
    pid = h.init().producer_id
    h.set_epoch(MAX - 1)
    h.add(pid, MAX - 1)
    h.hold_markers = True
    o = h.end(pid, MAX - 1)
    prepared = h.state()
    assert prepared.state == S.PREPARE_COMMIT and prepared.next_producer_id == o.producer_id
    # Restart: a new coordinator replays the (flexible) record.
    record = decode_value("t1", encode_value(prepared, 1))
    h2 = Harness(first_id=5000)
    effects = h2.core.load([("t1", record)])
    # load() flags loaded before the caller runs the effects (the service does the same)
    assert [(e.producer_id, e.producer_epoch, e.commit) for e in effects] == [(pid, MAX, True)]
    h2.run(effects)
    m = h2.state()
    assert (m.state, m.producer_id, m.producer_epoch) == (S.COMPLETE_COMMIT, o.producer_id, 0)
    retry = h2.end(pid, MAX - 1)
    assert retry.error is None and (retry.producer_id, retry.producer_epoch) == (o.producer_id, 0)
