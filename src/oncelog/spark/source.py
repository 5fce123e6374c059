"""The ``oncelog`` PySpark data source: batch and streaming reads (Spark's Python Data Source
API, ``pyspark.sql.datasource``).

Offsets are Spark's Kafka source's: ``{"topic": {"partition": next offset}}``. The driver plans
(which partitions, up to where: the last stable offset for read_committed, so that a micro-batch
never waits on an open transaction), the executors read their range with our consumer, which
skips aborted records and control batches; the offsets those leave out are simply never
returned, so a range is done when the consumer's position reaches its end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

try:  # Spark 4.2+: admission control for Python streaming sources
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
except ImportError:  # pragma: no cover - older Spark
    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

from .options import EARLIEST, LATEST, OptionError, SourceOptions, parse

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

    def _consumer(self):
        from .. import Consumer

        return Consumer(self.opts.client_config())

    def partitions(self) -> list[tuple[str, int]]:
        from .. import Admin

        o = self.opts
        if o.assign is not None:
            return sorted((t, p) for t, ps in o.assign.items() for p in ps)
        with Admin({"bootstrap.servers": o.bootstrap_servers,
                    **{k: v for k, v in o.client.items() if k.startswith(("security.", "sasl."))}
                    }) as admin:
            existing = admin.list_topics()
            if o.subscribe is not None:
                topics = [t for t in o.subscribe if t in set(existing)]
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
        from .. import TopicPartition

        c = self._consumer()
        try:
            keys = [TopicPartition(t, p) for t, p in tps]
            earliest = c.beginning_offsets(keys)
            latest = c.end_offsets(keys)
        finally:
            c.close()
        return ({(tp.topic, tp.partition): o for tp, o in earliest.items()},
                {(tp.topic, tp.partition): o for tp, o in latest.items()})

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


def _flat(offsets: dict) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


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
        idle_deadline = time.monotonic() + 60
        while c.position(tp) < r.end:
            got = c.poll_columns(0.5)
            if got:
                idle_deadline = time.monotonic() + 60
            elif time.monotonic() > idle_deadline:
                raise TimeoutError(f"{r.topic}-{r.partition}: no progress towards offset "
                                   f"{r.end} for 60 s (at {c.position(tp)})")
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
        opts = parse(self.options)
        if "endingoffsets" in {k.lower() for k in self.options}:
            raise OptionError("endingOffsets is for batch queries only")
        return OncelogStreamReader(opts)


class OncelogBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        if opts.starting == "latest":
            raise OptionError("startingOffsets latest makes no sense for a batch query")
        if opts.starting is None:
            opts.starting = "earliest"

    def partitions(self):
        planner = _Planner(self.opts)
        tps = planner.partitions()
        earliest, latest = planner.offsets(tps)
        start = _flat(planner.resolve(self.opts.starting, tps, earliest, latest, "earliest"))
        end = _flat(planner.resolve(self.opts.ending, tps, earliest, latest, "latest"))
        for tp in tps:
            t, p = tp
            if end[tp] > latest[tp]:
                raise OptionError(f"endingOffsets: {t}-{p} ends at {latest[tp]} (the last "
                                  f"stable offset), not {end[tp]}")
            if start[tp] > end[tp]:
                raise OptionError(f"{t}-{p}: startingOffsets {start[tp]} is past "
                                  f"endingOffsets {end[tp]}")
        return [TopicPartitionRange(t, p, _checked(self.opts, t, p, start[(t, p)],
                                                   earliest[(t, p)]), end[(t, p)])
                for t, p in tps]

    def read(self, partition):
        return read_range(self.opts, partition)


def _checked(opts: SourceOptions, topic: str, partition: int, start: int, earliest: int) -> int:
    if start < earliest:
        if opts.fail_on_data_loss:
            raise DataLossError(
                f"{topic}-{partition}: offsets {start}..{earliest - 1} are gone (retention); "
                "set failOnDataLoss=false to skip them")
        return earliest
    return start


class OncelogStreamReader(DataSourceStreamReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.planner = _Planner(opts)

    def initialOffset(self) -> dict:
        tps = self.planner.partitions()
        earliest, latest = self.planner.offsets(tps)
        return self.planner.resolve(self.opts.starting or "latest", tps, earliest, latest,
                                    "latest")

    def getDefaultReadLimit(self):
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        tps = self.planner.partitions()
        earliest, latest = self.planner.offsets(tps)
        begin = _flat(start or {})
        # Partitions that appeared since (subscribePattern, new partitions): from the earliest.
        for tp in tps:
            begin.setdefault(tp, earliest[tp])
        end = {tp: max(latest[tp], begin[tp]) for tp in tps}
        cap = getattr(limit, "max_rows", None)
        if cap is None and limit is None and self.opts.max_offsets_per_trigger:
            cap = self.opts.max_offsets_per_trigger  # Spark without admission control
        if cap is not None:
            end = _rate_limit(begin, end, int(cap))
        out: dict[str, dict[str, int]] = {}
        for (t, p), o in sorted(end.items()):
            out.setdefault(t, {})[str(p)] = o
        return out

    def partitions(self, start: dict, end: dict):
        begin, stop = _flat(start), _flat(end)
        earliest = None
        out = []
        for (t, p), e in sorted(stop.items()):
            s = begin.get((t, p), 0)
            if s >= e:
                continue
            if earliest is None:
                earliest = self.planner.offsets(sorted(stop))[0]
            out.append(TopicPartitionRange(t, p, _checked(self.opts, t, p, s,
                                                          earliest.get((t, p), 0)), e))
        return out

    def read(self, partition):
        return read_range(self.opts, partition)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint, as with Spark's Kafka source


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
