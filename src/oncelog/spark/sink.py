"""The exactly-once ``oncelog`` sink (design: docs/spark.md).

Each task writes its rows in a two-phase-commit transaction of its own (transactional id
``{prefix}-{partition}-{attempt}``), records the micro-batch id in the same transaction (the
offset ``batch + 1`` of group ``{prefix}-batches-{partition}`` for partition 0 of the topic
``__oncelog_spark_batches``, which brokers show as internal: oncelog/spark_markers.py), prepares, and hands the PreparedTxnState to the driver in its
commit message. The driver writes its decision (the list of prepared transactions of the batch)
to the checkpoint directory, then completes every one of them, then aborts whatever else the
prefix has open (failed and speculative attempts). A driver that dies in between rolls the
decision forward when it starts again; a replayed batch finds its marker and writes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..spark_markers import MARKER_TOPIC
from . import fault_points
from .options import connection_settings, sink_settings
from .write_checks import NULL_TOPIC, save_mode_error, validate_query

# A task sends its rows all at once and then prepares: batches far larger than a producer's
# default (16 KiB) cost the broker a fraction per record (measured: a task's 150,000 rows of
# 100 B went out 5x faster with 512 KiB), and stay under Kafka's default message.max.bytes and
# max.request.size (1 MiB). kafka.batch.size and kafka.linger.ms still win.
PRODUCER_DEFAULTS = {"linger.ms": "5", "batch.size": str(512 << 10)}


class SinkError(RuntimeError):
    pass


@dataclass
class PreparedTask(WriterCommitMessage):
    transactional_id: str
    state: str  # str(PreparedTxnState); "" when the task had nothing to do
    partition: int
    skipped: bool = False  # the batch was committed before (a replay)


@dataclass
class SinkOptions:
    bootstrap_servers: str
    topic: str | None
    prefix: str
    checkpoint: str | None
    client: dict
    # The transactional id the driver checks two-phase commit with (check_two_phase_commit):
    # one of the sink's own, so that ACLs granting its prefix grant it; for batch writes without
    # a prefix, one fixed id rather than one more per write.
    check_id: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, Any], streaming: bool = True) -> SinkOptions:
        # Checked on the driver before any task (an OptionError names the option).
        opts, client = sink_settings(options)
        bootstrap = opts["kafka.bootstrap.servers"]
        checkpoint = opts.get("checkpointlocation")
        prefix = opts.get("transactionalidprefix")
        check_id = f"{prefix}-check"
        if prefix is None and not streaming:
            # A batch write has no replay to recognise: ids of its own.
            prefix = f"oncelog-spark-write-{uuid.uuid4().hex[:16]}"
            check_id = "oncelog-spark-write-check"
        if prefix is None:
            if checkpoint is None:
                raise SinkError("give the option transactionalIdPrefix (or a checkpointLocation, "
                                "from which it is derived)")
            digest = hashlib.sha256(os.path.abspath(checkpoint).encode()).hexdigest()[:16]
            prefix = f"oncelog-spark-{digest}"
            check_id = f"{prefix}-check"
        # Spark's Kafka sink trims the topic option.
        topic = opts["topic"].strip() if "topic" in opts else None
        return cls(bootstrap, topic, prefix, checkpoint, client, check_id)

    def producer(self, transactional_id: str):
        from .. import Producer

        return Producer({"bootstrap.servers": self.bootstrap_servers,
                         "transactional.id": transactional_id,
                         "transaction.two.phase.commit.enable": "true", **PRODUCER_DEFAULTS,
                         **self.client})

    def consumer(self, group: str):
        from .. import Consumer

        # Committed offsets only (read_uncommitted: pending ones are undecided, not done).
        return Consumer({**connection_settings(self.bootstrap_servers, self.client),
                         "group.id": group, "isolation.level": "read_uncommitted",
                         "enable.auto.commit": "false"})

    def admin(self):
        from .. import Admin

        return Admin(connection_settings(self.bootstrap_servers, self.client))

    def shared_admin(self):
        """This process's Admin for these brokers, kept across tasks and micro-batches (Spark
        reuses its Python workers): the marker look-ups of every task go over its connections
        instead of a new client's each time. Not to be closed by the caller."""
        key = json.dumps(connection_settings(self.bootstrap_servers, self.client),
                         sort_keys=True)
        admin = _SHARED_ADMINS.get(key)
        if admin is None:
            admin = _SHARED_ADMINS[key] = self.admin()
        return admin

    def committed_offset(self, group: str, tp) -> int | None:
        """The committed offset of ``tp`` in ``group`` (None if none): only what is committed,
        not pending in an open transaction (OffsetFetch without require_stable)."""
        return self.shared_admin().list_consumer_group_offsets(group, [tp]).get(tp)


_SHARED_ADMINS: dict[str, Any] = {}
# Brokers (bootstrap lists) on which this process has seen the marker topic exist.
_MARKER_TOPIC_SEEN: set[str] = set()


def _row_fields(opts: SinkOptions, d: dict) -> tuple:
    topic = opts.topic or d.get("topic")  # the option wins over the column, as in Spark
    if not topic:
        raise SinkError(NULL_TOPIC)
    value = d.get("value")
    if isinstance(value, str):
        value = value.encode()
    key = d.get("key")
    if isinstance(key, str):
        key = key.encode()
    headers = [(h["key"], h["value"]) for h in (d.get("headers") or [])]
    return topic, value, key, d.get("partition"), headers or None


def _send_rows(opts: SinkOptions, p, rows) -> list[tuple[str, Any, Any]]:
    """Queue a task's input with ``p``: ``pyarrow.RecordBatch``es (Spark's Arrow writer path)
    in bulk, or ``Row``s one by one. Returns (topic, partition, future) of what was sent; a
    row refused at once (unknown partition, too large, ...) raises SinkError here."""
    sent: list[tuple[str, Any, Any]] = []
    for item in rows:
        if hasattr(item, "asDict"):
            topic, value, key, part, headers = _row_fields(opts, item.asDict())
            future = p.send(topic, value, key=key, partition=part, headers=headers)
            sent.append((topic, part, future))
        else:
            from .arrow_io import RowError, send_record_batch

            try:
                sent.extend(send_record_batch(p, item, opts.topic))
            except RowError as exc:
                raise SinkError(str(exc)) from None
        if sent and sent[-1][2].done():
            _check_sent(*sent[-1])
    return sent


def _check_sent(topic: str, part: Any, future) -> None:
    """Never commit a batch without one of its rows (unknown partition, too large, ...): the
    task fails, Spark retries it and then fails the query."""
    failed = future.exception() if future.done() else None
    if failed is not None:
        where = f"topic {topic!r}" + ("" if part is None else f" partition {part}")
        raise SinkError(f"a row for {where} cannot be written: "
                        f"{type(failed).__name__}: {failed}") from failed


def _batch_marker(opts: SinkOptions, partition: int) -> tuple[str, Any]:
    """Where a task's transaction records that it wrote micro-batch B for Spark partition P:
    offset B + 1 of the group ``{prefix}-batches-{P}`` on partition 0 of the marker topic.
    (Offsets are committed to partitions that exist, as Kafka requires; earlier versions used
    group ``{prefix}`` and partition P of a topic never created: ``_legacy_batch_marker``.)"""
    from .. import TopicPartition

    return f"{opts.prefix}-batches-{partition}", TopicPartition(MARKER_TOPIC, 0)


def _legacy_batch_marker(opts: SinkOptions, partition: int) -> tuple[str, Any]:
    """The marker of queries checkpointed before the marker topic existed: still read, so
    that such a query replays none of its committed batches after the upgrade."""
    from .. import TopicPartition

    return opts.prefix, TopicPartition(MARKER_TOPIC, partition)


def _ensure_marker_topic(opts: SinkOptions) -> None:
    """The marker topic (one partition), created by the driver before any task commits to it."""
    from .. import NewTopic
    from ..errors import TopicAlreadyExistsError

    if opts.bootstrap_servers in _MARKER_TOPIC_SEEN:
        return  # PySpark makes a writer on the driver for every micro-batch's plan and commit
    with contextlib.suppress(TopicAlreadyExistsError):
        opts.shared_admin().create_topics([NewTopic(MARKER_TOPIC, num_partitions=1)])
    _MARKER_TOPIC_SEEN.add(opts.bootstrap_servers)


# (bootstrap servers, check id) that passed check_two_phase_commit in this process: the driver's
# Python worker that creates a streaming writer for every commit checks once, not every batch.
_two_phase_checked: set[tuple[str, str]] = set()


def check_two_phase_commit(opts: SinkOptions) -> None:
    """On the driver, before any task: run the InitProducerId with two-phase commit that every
    task will run, once, so that a broker without ``transaction.two.phase.commit.enable``
    fails the write at once with a message that says so (KIP-939: the coordinator answers
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED), not in every task attempt."""
    from ..errors import TransactionalIdAuthorizationFailedError

    key = (opts.bootstrap_servers, opts.check_id)
    if key in _two_phase_checked:
        return
    p = opts.producer(opts.check_id)
    try:
        p.init_transactions()
    except TransactionalIdAuthorizationFailedError as exc:
        raise SinkError(
            f"the broker ({opts.bootstrap_servers}) refused a two-phase-commit transaction "
            f"({exc}): the oncelog sink needs brokers running with "
            "transaction.two.phase.commit.enable=true (oncelog broker --set "
            "transaction.two.phase.commit.enable=true) and, where ACLs are on, TWO_PHASE_COMMIT "
            f"allowed on the transactional ids {opts.check_id.rsplit('-', 1)[0]}-*") from exc
    finally:
        p.close()
    _two_phase_checked.add(key)


def _aborted_marker(opts: SinkOptions, write_id: str) -> tuple[str, Any]:
    """Where the driver records that batch write ``write_id`` was aborted: an offset of the
    group ``{prefix}-aborted-{write_id}``."""
    from .. import TopicPartition

    return f"{opts.prefix}-aborted-{write_id}", TopicPartition(MARKER_TOPIC, 0)


def _task_write(opts: SinkOptions, rows, batch_id: int | None,
                write_id: str | None = None) -> PreparedTask:
    """One task's rows in one prepared transaction. ``batch_id`` is the micro-batch (its id is
    recorded in the transaction, and a replay of a committed batch writes nothing); None for a
    batch (non-streaming) write, which has its ``write_id`` instead (see ``aborted``)."""
    from pyspark import TaskContext


    tc = TaskContext.get()
    if tc is None:
        raise SinkError("the oncelog sink's write() runs in a Spark task")
    partition, attempt = tc.partitionId(), tc.attemptNumber()
    fault_points.reached(f"task:{partition}:{attempt}:start")
    txn_id = f"{opts.prefix}-{partition}-{attempt}"
    marker_group, marker = _batch_marker(opts, partition)

    def committed() -> bool:
        """Is this micro-batch's marker for this partition committed (by any attempt)?"""
        if batch_id is None:
            return False
        for group, tp in (_batch_marker(opts, partition),
                          _legacy_batch_marker(opts, partition)):
            done = opts.committed_offset(group, tp)
            if done is not None:
                return done > batch_id
        return False

    def aborted() -> bool:
        """Did the driver abort this batch write? (Its job failed while this task, cancelled,
        went on: the driver's clean-up may have looked before this transaction was open.)"""
        if write_id is None:
            return False
        group, tp = _aborted_marker(opts, write_id)
        return opts.committed_offset(group, tp) is not None

    p = opts.producer(txn_id)
    try:
        # Fences and aborts whatever an earlier incarnation of this id left (a prepared
        # transaction of a batch the driver never decided: decided ones were completed by the
        # driver before any task of this run started).
        p.init_transactions()
        if committed():
            return PreparedTask(txn_id, "", partition, skipped=True)  # a replay
        fault_points.reached(f"task:{partition}:{attempt}:begin")
        p.begin_transaction()
        try:
            sent = _send_rows(opts, p, rows)
            if batch_id is not None:
                p.send_offsets_to_transaction({marker: batch_id + 1}, marker_group)
            fault_points.reached(f"task:{partition}:{attempt}:before-prepare")
            p.flush()
            for topic, part, future in sent:
                _check_sent(topic, part, future)
            state = p.prepare_transaction()
        except Exception:
            # Abort now rather than leave the transaction open (a two-phase one never times
            # out) until the driver's clean-up; the retry is a new attempt with an id of its own.
            with contextlib.suppress(Exception):
                p.abort_transaction()
            raise
        fault_points.reached(f"task:{partition}:{attempt}:after-prepare")
        if committed() or aborted():
            # A straggler (a speculative race lost): another attempt's transaction for this
            # batch and partition is already committed, and the driver, which aborts every
            # transaction of this sink still open once it has committed, may have looked before
            # this one was open. Or the batch write was aborted, and its driver may have looked
            # before this one was open. Its result will be thrown away: abort it now.
            p.abort_transaction()
            return PreparedTask(txn_id, "", partition, skipped=True)
        return PreparedTask(txn_id, str(state), partition)
    finally:
        p.close()


class _Driver:
    """The driver's half: decide, complete, clean up, recover."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.dir = Path(opts.checkpoint, "oncelog-sink") if opts.checkpoint else None

    def _decision(self, name: str) -> Path | None:
        return self.dir / f"{name}.json" if self.dir else None

    def recover(self) -> None:
        """Roll forward every decision a dead driver left unfinished. Runs whenever Spark
        creates the writer on the driver: when the query (re)starts, before any of its tasks
        (so that a replayed batch finds its markers committed), and again for every commit
        (PySpark makes a new writer to commit with: then there is nothing left to do, and the
        current batch's prepared transactions are not touched: they are not decided yet).
        First of all, the marker topic is made to exist."""
        _ensure_marker_topic(self.opts)
        if self.dir is not None and self.dir.exists():
            for f in sorted(self.dir.glob("*.json")):
                decision = json.loads(f.read_text())
                self._complete(decision["tasks"])
                self._finish(f)

    def commit(self, messages, batch_id: int | None) -> None:
        tasks = [(m.transactional_id, m.state) for m in messages
                 if m is not None and not m.skipped and m.state]
        f = self._decision(f"batch-{batch_id}" if batch_id is not None else
                           f"write-{uuid.uuid4().hex}")
        decision = {"batch": batch_id, "tasks": tasks, "done": False}
        if f is not None:
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_suffix(".tmp")
            tmp.write_text(json.dumps(decision))
            os.replace(tmp, f)
        fault_points.reached("driver:before-complete")
        self._complete(tasks)
        fault_points.reached("driver:after-complete")
        # Now whatever of this sink is still open is undecided, so never to be committed:
        # failed or speculative attempts, tasks of a batch whose driver died before deciding
        # (the replay's tasks reuse those ids and abort them themselves, but not always all).
        self._abort_others()
        if f is not None:
            self._finish(f)

    def abort(self, messages, write_id: str | None = None) -> None:
        """The batch failed: abort what its tasks prepared, and whatever else of this sink is
        open (attempts that died after preparing are in no message)."""
        if write_id is not None:
            # Before the listing: a task that prepares after it finds this mark and aborts
            # itself; one that checked before it had its transaction open, so it is listed.
            group, tp = _aborted_marker(self.opts, write_id)
            with self.opts.consumer(group) as c:
                c.commit({tp: 1})
        with self.opts.admin() as admin:
            for m in messages:
                if m is not None and m.state:
                    admin.force_terminate_transaction(m.transactional_id)
        self._abort_others()

    def _complete(self, tasks) -> None:
        """Complete every prepared transaction of the decision. The first alone (the crash
        tests stop the driver after it: a decision half carried out), then the rest at once,
        each over a producer of its own: the coordinators work on them in parallel."""
        if not tasks:
            return
        self._complete_one(*tasks[0])
        fault_points.reached("driver:mid-complete")
        if len(tasks) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(16, len(tasks) - 1),
                                    thread_name_prefix="oncelog-complete") as pool:
                for f in [pool.submit(self._complete_one, *t) for t in tasks[1:]]:
                    f.result()

    def _complete_one(self, txn_id: str, state: str) -> None:
        from .. import PreparedTxnState

        p = self.opts.producer(txn_id)
        try:
            p.init_transactions(keep_prepared_txn=True)
            p.complete_transaction(PreparedTxnState(state))
        finally:
            p.close()

    def _abort_others(self) -> None:
        """Transactions of this sink still open (failed or speculative attempts, undecided
        batches): abort them."""
        admin = self.opts.shared_admin()
        for t in admin.list_transactions(states=["Ongoing"]):
            if t.transactional_id.startswith(self.opts.prefix + "-"):
                admin.force_terminate_transaction(t.transactional_id)

    @staticmethod
    def _finish(f: Path) -> None:
        """The decision is carried out: the markers in the log say which batches are done."""
        f.unlink(missing_ok=True)


class OncelogStreamWriter(DataSourceStreamArrowWriter):
    """The streaming sink. Spark hands ``write`` the task's rows as ``pyarrow.RecordBatch``es;
    an iterator of ``Row``s is taken too (tests play Spark's part with those)."""

    def __init__(self, options: Mapping[str, Any], schema=None) -> None:
        """``schema``: the query's (from ``DataSource.streamWriter``), checked as Spark's Kafka
        sink checks it. (Complete and update output modes append, as with Spark's Kafka sink.)"""
        self.opts = SinkOptions.parse(options)
        if schema is not None:
            validate_query(schema, self.opts.topic)
        check_two_phase_commit(self.opts)
        # On the driver, when the query (re)starts and before any task runs: a batch whose
        # decision a dead driver left unfinished is completed first, so that its replay finds
        # every partition's marker committed and writes nothing.
        _Driver(self.opts).recover()

    def write(self, iterator):
        from pyspark import TaskContext

        batch = TaskContext.get().getLocalProperty("streaming.sql.batchId")
        if batch is None:
            raise SinkError("no micro-batch id in the task (streaming.sql.batchId)")
        return _task_write(self.opts, iterator, int(batch))

    def commit(self, messages, batchId: int) -> None:
        _Driver(self.opts).commit(messages, batchId)

    def abort(self, messages, batchId: int) -> None:
        _Driver(self.opts).abort(messages)


class OncelogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("oncelog")``: one write, transactional across all its tasks. With a
    ``transactionalIdPrefix`` and a ``checkpointLocation`` option, a write whose driver died
    while completing is rolled forward by the next write with the same options; without them
    the ids are new for every write."""

    def __init__(self, options: Mapping[str, Any], schema=None, overwrite: bool = False) -> None:
        """``schema`` and ``overwrite``: the DataFrame's and the save mode's (from
        ``DataSource.writer``), refused as Spark's Kafka sink refuses them, before any task."""
        if overwrite:
            raise save_mode_error("Overwrite")
        self.opts = SinkOptions.parse(options, streaming=False)
        if schema is not None:
            validate_query(schema, self.opts.topic)
        check_two_phase_commit(self.opts)
        # This write's own name (the writer is pickled to its tasks and to its commit or
        # abort): its abort is recorded under it, for tasks still running.
        self.write_id = uuid.uuid4().hex
        _Driver(self.opts).recover()

    def write(self, iterator):
        return _task_write(self.opts, iterator, None, self.write_id)

    def commit(self, messages) -> None:
        _Driver(self.opts).commit(messages, None)

    def abort(self, messages) -> None:
        _Driver(self.opts).abort(messages, self.write_id)
