"""The exactly-once ``oncelog`` sink (design: docs/spark.md).

Each task writes its rows in a two-phase-commit transaction of its own (transactional id
``{prefix}-{partition}-{attempt}``), records the micro-batch id in the same transaction (the
offset ``batch + 1`` of group ``{prefix}`` for partition ``partition`` of the pseudo topic
``__oncelog_spark_batches``), prepares, and hands the PreparedTxnState to the driver in its
commit message. The driver writes its decision (the list of prepared transactions of the batch)
to the checkpoint directory, then completes every one of them, then aborts whatever else the
prefix has open (failed and speculative attempts). A driver that dies in between rolls the
decision forward when it starts again; a replayed batch finds its marker and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

MARKER_TOPIC = "__oncelog_spark_batches"


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

    @classmethod
    def parse(cls, options: dict) -> SinkOptions:
        opts = {k.lower(): str(v) for k, v in options.items()}
        bootstrap = opts.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise SinkError("option kafka.bootstrap.servers is required")
        checkpoint = opts.get("checkpointlocation")
        prefix = opts.get("transactionalidprefix")
        if prefix is None:
            if checkpoint is None:
                raise SinkError("give the option transactionalIdPrefix (or a checkpointLocation, "
                                "from which it is derived)")
            digest = hashlib.sha256(os.path.abspath(checkpoint).encode()).hexdigest()[:16]
            prefix = f"oncelog-spark-{digest}"
        client = {k[len("kafka."):]: v for k, v in opts.items()
                  if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        return cls(bootstrap, opts.get("topic"), prefix, checkpoint, client)

    def producer(self, transactional_id: str):
        from .. import Producer

        return Producer({"bootstrap.servers": self.bootstrap_servers,
                         "transactional.id": transactional_id,
                         "transaction.two.phase.commit.enable": "true", "linger.ms": "5",
                         **self.client})

    def admin(self):
        from .. import Admin

        return Admin({"bootstrap.servers": self.bootstrap_servers,
                      **{k: v for k, v in self.client.items()
                         if k.startswith(("security.", "sasl."))}})


def _crash_hook(point: str) -> None:
    """Tests: ONCELOG_SPARK_CRASH=<point> kills this process there: driver:before-complete,
    driver:mid-complete, driver:after-complete, task:<partition>:<attempt>:<start |
    before-prepare | after-prepare>."""
    want = os.environ.get("ONCELOG_SPARK_CRASH")
    if want and want == point:
        os._exit(137)


def _task_write(opts: SinkOptions, rows, batch_id: int) -> PreparedTask:
    from pyspark import TaskContext

    from .. import Consumer, TopicPartition

    tc = TaskContext.get()
    partition, attempt = tc.partitionId(), tc.attemptNumber()
    _crash_hook(f"task:{partition}:{attempt}:start")
    txn_id = f"{opts.prefix}-{partition}-{attempt}"
    marker = TopicPartition(MARKER_TOPIC, partition)
    if attempt > 0:
        # Earlier attempts of this task may have left a prepared transaction (their pending
        # marker offset would also hold the check below back): abort them, fencing any still
        # running (a speculative race is then won by this attempt).
        with opts.admin() as admin:
            for earlier in range(attempt):
                admin.force_terminate_transaction(f"{opts.prefix}-{partition}-{earlier}")
    c = Consumer({"bootstrap.servers": opts.bootstrap_servers, "group.id": opts.prefix,
                  **{k: v for k, v in opts.client.items()
                     if k.startswith(("security.", "sasl."))}})
    try:
        done = c.committed([marker]).get(marker)
    finally:
        c.close()
    if done is not None and done > batch_id:
        return PreparedTask(txn_id, "", partition, skipped=True)  # a replay of a committed batch
    p = opts.producer(txn_id)
    try:
        p.init_transactions()
        p.begin_transaction()
        for row in rows:
            d = row.asDict()
            topic = d.get("topic") or opts.topic
            if not topic:
                raise SinkError("a row has no topic (give a topic column or the topic option)")
            value = d.get("value")
            if isinstance(value, str):
                value = value.encode()
            key = d.get("key")
            if isinstance(key, str):
                key = key.encode()
            headers = [(h["key"], h["value"]) for h in (d.get("headers") or [])]
            p.send(topic, value, key=key, partition=d.get("partition"), headers=headers or None)
        p.send_offsets_to_transaction({marker: batch_id + 1}, opts.prefix)
        _crash_hook(f"task:{partition}:{attempt}:before-prepare")
        state = p.prepare_transaction()
        _crash_hook(f"task:{partition}:{attempt}:after-prepare")
        return PreparedTask(txn_id, str(state), partition)
    finally:
        p.close()


class _Driver:
    """The driver's half: decide, complete, clean up, recover."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.dir = Path(opts.checkpoint, "oncelog-sink") if opts.checkpoint else None
        self._recovered = False

    def _decision(self, batch_id: int) -> Path | None:
        return self.dir / f"batch-{batch_id}.json" if self.dir else None

    def recover(self) -> None:
        """Roll forward any decision a dead driver left unfinished (before anything else of
        this sink is decided: the current batch's prepared transactions must stay)."""
        if self._recovered:
            return
        self._recovered = True
        if self.dir is not None and self.dir.exists():
            for f in sorted(self.dir.glob("batch-*.json")):
                decision = json.loads(f.read_text())
                if not decision.get("done"):
                    self._complete(decision["tasks"])
                    self._finish(f, decision)

    def commit(self, messages, batch_id: int) -> None:
        self.recover()
        tasks = [(m.transactional_id, m.state) for m in messages
                 if m is not None and not m.skipped and m.state]
        f = self._decision(batch_id)
        decision = {"batch": batch_id, "tasks": tasks, "done": False}
        if f is not None:
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_suffix(".tmp")
            tmp.write_text(json.dumps(decision))
            os.replace(tmp, f)
        _crash_hook("driver:before-complete")
        self._complete(tasks)
        _crash_hook("driver:after-complete")
        # Now only failed or speculative attempts' transactions can still be open.
        self._abort_others(keep=set())
        if f is not None:
            self._finish(f, decision)

    def abort(self, messages) -> None:
        with self.opts.admin() as admin:
            for m in messages:
                if m is not None and m.state:
                    admin.force_terminate_transaction(m.transactional_id)

    def _complete(self, tasks) -> None:
        from .. import PreparedTxnState

        for i, (txn_id, state) in enumerate(tasks):
            p = self.opts.producer(txn_id)
            try:
                p.init_transactions(keep_prepared_txn=True)
                p.complete_transaction(PreparedTxnState(state))
            finally:
                p.close()
            if i == 0:
                _crash_hook("driver:mid-complete")

    def _abort_others(self, keep: set[str]) -> None:
        """Transactions of this sink still open (failed or speculative attempts): abort."""
        with self.opts.admin() as admin:
            for t in admin.list_transactions(states=["Ongoing"]):
                if t.transactional_id.startswith(self.opts.prefix + "-") \
                        and t.transactional_id not in keep:
                    admin.force_terminate_transaction(t.transactional_id)

    @staticmethod
    def _finish(f: Path, decision: dict) -> None:
        decision["done"] = True
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps(decision))
        os.replace(tmp, f)


class OncelogStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: dict) -> None:
        self.opts = SinkOptions.parse(options)
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


class OncelogBatchWriter(DataSourceWriter):
    """``df.write.format("oncelog")``: one batch, transactional across all tasks (batch id 0 of
    its own prefix)."""

    def __init__(self, options: dict) -> None:
        self.opts = SinkOptions.parse(options)

    def write(self, iterator):
        return _task_write(self.opts, iterator, 0)

    def commit(self, messages) -> None:
        _Driver(self.opts).commit(messages, 0)

    def abort(self, messages) -> None:
        _Driver(self.opts).abort(messages)
