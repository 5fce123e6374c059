"""The ``oncelog`` PySpark data source: batch and streaming reads (Spark's Python Data Source
API, ``pyspark.sql.datasource``).

Offsets are Spark's Kafka source's: ``{"topic": {"partition": next offset}}``. The driver plans
(which partitions, up to where: the last stable offset for read_committed, so that a micro-batch
never waits on an open transaction), the executors read their range with our consumer, which
skips aborted records and control batches; the offsets those leave out are simply never
returned, so a range is done when the consumer's position reaches its end.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

try:  # Spark 4.2+: admission control for Python streaming sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older Spark
    ReadLimit = ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

from .options import EARLIEST, LATEST, OptionError, SourceOptions, connection_settings, parse
from .ranges import split_ranges

log = logging.getLogger("oncelog.spark")

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int")
HEADERS = ", headers array<struct<key: string, value: binary>>"


class DataLossError(RuntimeError):
    """Offsets to read are gone (retention deleted them) and failOnDataLoss is true."""


@dataclass
class TopicPartitionRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


class _Planner:
    """The driver's view: which partitions, and their offsets."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        # Kept across calls: a stream's planner lives as long as its query and asks for the
        # partitions and offsets at every trigger (a client's connections and metadata each
        # time would cost more than the questions).
        self._clients: dict[str, Any] = {}

    def __getstate__(self) -> dict:
        # The planner travels with its reader to the executors; its clients stay here.
        return {"opts": self.opts, "_clients": {}}

    def _consumer(self):
        c = self._clients.get("consumer")
        if c is None:
            from .. import Consumer

            # Looks offsets up only; with a kafka.group.id it must commit nothing (as Spark's
            # driver: enable.auto.commit=false).
            c = self._clients["consumer"] = Consumer(
                {**self.opts.client_config(), "enable.auto.commit": "false"})
        return c

    def _admin(self):
        a = self._clients.get("admin")
        if a is None:
            from .. import Admin

            a = self._clients["admin"] = Admin(
                connection_settings(self.opts.bootstrap_servers, self.opts.client))
        return a

    def close(self) -> None:
        """Close the kept clients (a failed call closes them too: the retry starts afresh)."""
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()

    def _retrying(self, what, fn):
        """fetchOffset.numRetries attempts, fetchOffset.retryIntervalMs apart (Spark's), each
        already retrying retriable errors within the client's own timeout."""
        for attempt in range(1, self.opts.fetch_offset_retries + 1):
            try:
                return fn()
            except OptionError:
                raise
            except Exception:
                self.close()
                if attempt == self.opts.fetch_offset_retries:
                    raise
                log.warning("fetching %s failed (attempt %d of %d)", what, attempt,
                            self.opts.fetch_offset_retries, exc_info=True)
                time.sleep(self.opts.fetch_offset_retry_interval_ms / 1000)
        raise AssertionError("unreachable")

    def partitions(self) -> list[tuple[str, int]]:
        return self._retrying("the partitions", self._partitions)

    def _partitions(self) -> list[tuple[str, int]]:

        o = self.opts
        if o.assign is not None:
            return sorted((t, p) for t, ps in o.assign.items() for p in ps)
        admin = self._admin()
        existing = admin.list_topics()
        if o.subscribe is not None:
            known = set(existing)
            topics = [t for t in o.subscribe if t in known]
        else:
            assert o.pattern is not None
            topics = [t for t in existing if o.pattern.fullmatch(t)]
        found = admin.describe_topics(topics) if topics else {}
        return sorted((t, p.partition) for t, d in found.items() for p in d.partitions)

    def offsets(self, tps: list[tuple[str, int]]) -> tuple[dict, dict]:
        """(earliest, latest) per partition; latest is the last stable offset for
        read_committed."""
        if not tps:
            return {}, {}
        return self._retrying("the offsets", lambda: self._offsets(tps))

    def earliest(self, tps: list[tuple[str, int]]) -> dict:
        """The log start offset per partition (all a micro-batch's data-loss check needs)."""
        if not tps:
            return {}
        return self._retrying("the earliest offsets", lambda: self._looked_up("beginning", tps))

    def _offsets(self, tps: list[tuple[str, int]]) -> tuple[dict, dict]:
        return self._looked_up("beginning", tps), self._looked_up("end", tps)

    def _looked_up(self, which: str, tps: list[tuple[str, int]]) -> dict:
        from .. import TopicPartition

        c = self._consumer()
        ask = c.beginning_offsets if which == "beginning" else c.end_offsets
        found = ask([TopicPartition(t, p) for t, p in tps])
        return {(tp.topic, tp.partition): o for tp, o in found.items()}

    def for_times(self, wanted: dict[tuple[str, int], int], latest: dict) -> dict:
        """The first offset at or after each timestamp; None where no record is (before the
        end a reader may read: Kafka's ListOffsets answers nothing past it either)."""
        if not wanted:
            return {}
        from .. import TopicPartition

        def ask():
            return self._consumer().offsets_for_times({TopicPartition(t, p): ts
                                                       for (t, p), ts in wanted.items()})

        found = self._retrying("offsets by timestamp", ask)
        out: dict[tuple[str, int], int | None] = {}
        for tp in wanted:
            hit = found.get(TopicPartition(*tp))
            out[tp] = hit.offset if hit is not None and hit.offset < latest[tp] else None
        return out

    def resolve(self, spec, tps, earliest, latest, default: str) -> dict:
        out: dict[str, dict[str, int]] = {}
        for t, p in tps:
            if isinstance(spec, dict):
                o = spec.get(t, {}).get(p)
                choice = default if o is None else ("earliest" if o == EARLIEST else
                                                    "latest" if o == LATEST else o)
            else:
                choice = spec
            value = earliest[(t, p)] if choice == "earliest" else \
                latest[(t, p)] if choice == "latest" else int(choice)
            out.setdefault(t, {})[str(p)] = value
        return out

    def start(self, tps, earliest, latest, default: str) -> dict:
        """Where a batch query or a new stream starts: startingTimestamp, else
        startingOffsetsByTimestamp, else startingOffsets (Spark's order of preference)."""
        o = self.opts
        if not o.by_timestamp_start:
            _check_named(o.starting, tps, "startingOffsets")
            return self.resolve(o.starting or default, tps, earliest, latest, default)
        wanted = _timestamps_for(o.starting_timestamp, o.starting_by_timestamp, tps,
                                 "startingOffsetsByTimestamp")
        found = self.for_times(wanted, latest)
        out = self.resolve(default, tps, earliest, latest, default)
        for (t, p), offset in found.items():
            if offset is None:
                if o.by_timestamp_strategy == "error":
                    raise OptionError(
                        f"No offset matched from request of topic-partition {t}-{p} and "
                        f"timestamp {wanted[(t, p)]} (set startingOffsetsByTimestampStrategy "
                        "to latest to start such partitions at the latest offset)")
                offset = latest[(t, p)]
            out[t][str(p)] = offset
        return out

    def end(self, tps, earliest, latest) -> dict:
        """Where a batch query ends: endingTimestamp, else endingOffsetsByTimestamp, else
        endingOffsets; a timestamp that matches no record ends at the latest offset."""
        o = self.opts
        if not o.by_timestamp_end:
            _check_named(o.ending, tps, "endingOffsets")
            return self.resolve(o.ending, tps, earliest, latest, "latest")
        wanted = _timestamps_for(o.ending_timestamp, o.ending_by_timestamp, tps,
                                 "endingOffsetsByTimestamp")
        out = self.resolve("latest", tps, earliest, latest, "latest")
        for (t, p), offset in self.for_times(wanted, latest).items():
            out[t][str(p)] = latest[(t, p)] if offset is None else offset
        return out


def _timestamps_for(everywhere: int | None, per_partition: dict | None, tps,
                    name: str) -> dict[tuple[str, int], int]:
    if everywhere is not None:
        return dict.fromkeys(tps, everywhere)
    assert per_partition is not None
    _check_named(per_partition, tps, name)
    # A partition left out takes the default position, as with startingOffsets here (Spark
    # refuses a JSON that does not name every partition).
    return {(t, p): per_partition[t][p] for t, p in tps if p in per_partition.get(t, {})}


def _check_named(spec, tps, name: str) -> None:
    """A JSON position may only name partitions the query reads (Spark's rule too)."""
    if not isinstance(spec, dict):
        return
    reading = set(tps)
    stray = sorted(f"{t}-{p}" for t, parts in spec.items() for p in parts
                   if (t, p) not in reading)
    if stray:
        raise OptionError(f"{name} names partitions this query does not read: "
                          f"{', '.join(stray)}")


def _flat(offsets: dict) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def _nested(offsets: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = o
    return out


def _split(opts: SourceOptions, ranges: list[TopicPartitionRange]) -> list[TopicPartitionRange]:
    pieces = split_ranges([(r.topic, r.partition, r.start, r.end) for r in ranges],
                          opts.min_partitions, opts.max_records_per_partition)
    return [TopicPartitionRange(t, p, s, e) for t, p, s, e in pieces]


def read_range(opts: SourceOptions, r: TopicPartitionRange):
    """An executor's work: the records of [start, end) of one partition, as Arrow batches of
    Spark's Kafka rows (decoded in bulk: no Python object per record)."""
    from .. import Consumer, TopicPartition
    from .arrow_io import arrow_schema, spark_batch

    if r.start >= r.end:
        return
    schema = arrow_schema(opts.include_headers)
    tp = TopicPartition(r.topic, r.partition)
    c = Consumer({**FETCH_DEFAULTS, **opts.client_config(), "enable.auto.commit": "false",
                  "auto.offset.reset": "none"})
    try:
        c.assign([tp])
        c.seek(tp, r.start)
        idle = opts.poll_timeout_ms / 1000  # kafkaConsumer.pollTimeoutMs
        idle_deadline = time.monotonic() + idle
        while c.position(tp) < r.end:
            got = c.poll_columns(0.5)
            if got:
                idle_deadline = time.monotonic() + idle
            elif time.monotonic() > idle_deadline:
                raise TimeoutError(f"{r.topic}-{r.partition}: no progress towards offset "
                                   f"{r.end} for {idle:g} s (at {c.position(tp)}): "
                                   "kafkaConsumer.pollTimeoutMs")
            for columns in got.values():
                batch = spark_batch(schema, r.topic, r.partition, columns.to_arrow(), r.end)
                if batch is not None:
                    yield batch
    finally:
        c.close()


# A task reads one partition range from one broker: larger fetches than a consumer's
# defaults (Kafka's 1 MiB per partition) mean fewer round trips per task; the user's
# kafka.max.partition.fetch.bytes and kafka.fetch.max.bytes still win.
FETCH_DEFAULTS = {"max.partition.fetch.bytes": str(8 << 20), "fetch.max.bytes": str(64 << 20)}


class OncelogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return SCHEMA + (HEADERS if include else "")

    def reader(self, schema) -> DataSourceReader:
        return OncelogBatchReader(parse(self.options))

    def writer(self, schema, overwrite: bool):
        from .sink import OncelogBatchWriter

        return OncelogBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .sink import OncelogStreamWriter

        return OncelogStreamWriter(self.options, schema)

    def streamReader(self, schema) -> DataSourceStreamReader:
        return OncelogStreamReader(parse(self.options, streaming=True))


def _read(opts: SourceOptions, partition):
    # With no partition to read (a topic that does not exist, a pattern that matches
    # nothing), PySpark still runs one task, on a bare InputPartition: it reads nothing.
    if not isinstance(partition, TopicPartitionRange):
        return iter(())
    return read_range(opts, partition)


class OncelogBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self):
        planner = _Planner(self.opts)
        try:
            return self._partitions(planner)
        finally:
            planner.close()

    def _partitions(self, planner: _Planner):
        tps = planner.partitions()
        earliest, latest = planner.offsets(tps)
        start = _flat(planner.start(tps, earliest, latest, "earliest"))
        end = _flat(planner.end(tps, earliest, latest))
        for tp in tps:
            t, p = tp
            if end[tp] > latest[tp]:
                raise OptionError(f"endingOffsets: {t}-{p} ends at {latest[tp]} (the last "
                                  f"stable offset), not {end[tp]}")
            if start[tp] > end[tp]:
                if self.opts.by_timestamp_start or self.opts.by_timestamp_end:
                    raise OptionError(f"{t}-{p}: the start found by timestamp, offset "
                                      f"{start[tp]}, is past the end, offset {end[tp]}")
                raise OptionError(f"{t}-{p}: startingOffsets {start[tp]} is past "
                                  f"endingOffsets {end[tp]}")
        if self.opts.client_config()["isolation.level"] == "read_committed":
            at_lso = [tp for tp in tps if end[tp] == latest[tp]]
            try:
                warn_open_transactions(planner, at_lso, latest)
            except Exception as exc:  # noqa: BLE001 (a warning only: never fail the read)
                log.info("could not look for open transactions holding the last stable "
                         "offsets back: %s: %s", type(exc).__name__, exc)
        return _split(self.opts, [
            TopicPartitionRange(t, p, _checked(self.opts, t, p, start[(t, p)],
                                               earliest[(t, p)]), end[(t, p)])
            for t, p in tps])

    def read(self, partition):
        return _read(self.opts, partition)


def warn_open_transactions(planner: _Planner, tps: list[tuple[str, int]], lso: dict) -> None:
    """A read_committed batch read ends at the last stable offset: where that is below the high
    watermark, an open transaction holds the partition back, and the read leaves out what
    follows it, committed or not. Say so on the driver (a WARNING of the ``oncelog.spark``
    logger), naming the partition, the transactional id whose transaction starts at the LSO
    (DescribeProducers: the producer id whose open transaction starts there; ListTransactions
    and DescribeTransactions: its transactional id and start time) and how long it has been
    open, as ``oncelog transactions`` shows it."""
    from .. import TopicPartition

    if not tps:
        return
    admin = planner._admin()
    ends = admin.list_offsets({TopicPartition(t, p): LATEST for t, p in tps})
    held = {(tp.topic, tp.partition): r.offset for tp, r in ends.items()
            if r.offset > lso[(tp.topic, tp.partition)]}
    if not held:
        return
    producers = admin.describe_producers([TopicPartition(t, p) for t, p in sorted(held)])
    now = time.time() * 1000
    for (t, p), hw in sorted(held.items()):
        stable = lso[(t, p)]
        holder = next((s for s in producers.get(TopicPartition(t, p), ())
                       if s.current_txn_start_offset == stable), None)
        who = "an open transaction"
        if holder is not None:
            who = f"the open transaction of producer id {holder.producer_id}"
            listed = admin.list_transactions(producer_ids=[holder.producer_id])
            if listed:
                txn_id = listed[0].transactional_id
                described = admin.describe_transactions([txn_id])[txn_id]
                age = "" if described.start_ms is None else \
                    f", open for {max(0.0, (now - described.start_ms) / 1000):.1f} s"
                who = (f"the open transaction of transactional id {txn_id!r} (producer id "
                       f"{holder.producer_id}, state {described.state}{age})")
        log.warning(
            "%s-%d: this read_committed batch read ends at the last stable offset %d, below "
            "the high watermark %d: %s holds it there; the %d offsets after it are left out "
            "until that transaction commits or aborts (oncelog transactions list / "
            "force-terminate)", t, p, stable, hw, who, hw - stable)


def _checked(opts: SourceOptions, topic: str, partition: int, start: int, earliest: int) -> int:
    if start < earliest:
        if opts.fail_on_data_loss:
            raise DataLossError(
                f"{topic}-{partition}: offsets {start}..{earliest - 1} are gone (retention); "
                "set failOnDataLoss=false to skip them")
        return earliest
    return start


class OncelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.planner = _Planner(opts)
        # The latest offsets seen by the last latestOffset (reportLatestOffset shows them).
        self._latest: dict[tuple[str, int], int] = {}
        # Trigger.AvailableNow: the end pinned when the query started.
        self._target: dict[tuple[str, int], int] | None = None
        # minOffsetsPerTrigger: when the last micro-batch was let through (0: never, so the
        # first one never waits, as in Spark).
        self._last_trigger = 0.0

    def initialOffset(self) -> dict:
        tps = self.planner.partitions()
        earliest, latest = self.planner.offsets(tps)
        return self.planner.start(tps, earliest, latest, "latest")

    def getDefaultReadLimit(self):
        # PySpark has no composite read limit: with both minOffsetsPerTrigger and
        # maxOffsetsPerTrigger, latestOffset applies the maximum from the options itself.
        if self.opts.min_offsets_per_trigger is not None and ReadMinRows is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the end: what is there now (the last stable offsets); the query reads up to it
        in as many micro-batches as the read limit makes, and nothing that comes later."""
        tps = self.planner.partitions()
        self._target = self.planner.offsets(tps)[1]

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        tps = self.planner.partitions()
        earliest, latest = self.planner.offsets(tps)
        if self._target is not None:
            # Partitions that appeared after the pin are left for a later query.
            latest = {tp: min(o, self._target[tp]) for tp, o in latest.items()
                      if tp in self._target}
            tps = [tp for tp in tps if tp in self._target]
        begin = _flat(start or {})
        # Partitions that appeared since (subscribePattern, new partitions): from the earliest.
        for tp in tps:
            begin.setdefault(tp, earliest[tp])
        end = {tp: max(latest[tp], begin[tp]) for tp in tps}
        self._latest = dict(end)
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            return _nested(end)  # the engine's own limit wins over the options
        if self._delay(begin, end, limit):
            return start or {}
        cap = getattr(limit, "max_rows", None)
        if cap is None and self.opts.max_offsets_per_trigger and \
                (limit is None or getattr(limit, "min_rows", None) is not None):
            # Spark without admission control, or the maximum next to a minimum
            cap = self.opts.max_offsets_per_trigger
        if cap is not None:
            end = _rate_limit(begin, end, int(cap))
        return _nested(end)

    def _delay(self, begin: dict, end: dict, limit) -> bool:
        """minOffsetsPerTrigger: skip this trigger while fewer offsets than that are waiting,
        unless maxTriggerDelay has passed since the last micro-batch (Spark's delayBatch).
        Never under availableNow: the backlog is all there is, waiting would only stall."""
        minimum = getattr(limit, "min_rows", None)
        if minimum is None or self._target is not None:
            return False
        now = time.time()
        if (now - self._last_trigger) * 1000 >= self.opts.max_trigger_delay_ms:
            self._last_trigger = now
            return False
        if sum(end[tp] - begin[tp] for tp in end) < int(minimum):
            return True
        self._last_trigger = now
        return False

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets the last trigger saw (the query's progress shows them as the
        source's latestOffset; its endOffset is what was read, so the difference per partition
        is the offsets behind latest)."""
        return _nested(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict):
        begin, stop = _flat(start), _flat(end)
        earliest = None
        out = []
        for (t, p), e in sorted(stop.items()):
            s = begin.get((t, p), 0)
            if s >= e:
                continue
            if earliest is None:
                earliest = self.planner.earliest(sorted(stop))
            out.append(TopicPartitionRange(t, p, _checked(self.opts, t, p, s,
                                                          earliest.get((t, p), 0)), e))
        return _split(self.opts, out)

    def read(self, partition):
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint, as with Spark's Kafka source

    def stop(self) -> None:
        self.planner.close()  # the query ends: its clients' connections with it


def _rate_limit(begin: dict, end: dict, cap: int) -> dict:
    """maxOffsetsPerTrigger: split ``cap`` offsets over the partitions in proportion to what
    each has (as Spark's Kafka source does)."""
    lag = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(lag.values())
    if total <= cap:
        return end
    share = {tp: min(n, max(1 if n > 0 else 0, cap * n // total)) for tp, n in lag.items()}
    # What rounding down left over goes to the partitions with the most still to read.
    left = cap - sum(share.values())
    for tp in sorted(lag, key=lambda tp: share[tp] - lag[tp]):
        if left <= 0:
            break
        extra = min(left, lag[tp] - share[tp])
        share[tp] += extra
        left -= extra
    return {tp: begin[tp] + share[tp] for tp in lag}
