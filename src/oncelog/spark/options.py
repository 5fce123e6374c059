"""The options of Spark's Kafka source, parsed (no Spark needed: testable on its own).

Names and meanings are those of Spark's Structured Streaming + Kafka Integration Guide; option
names are case-insensitive, as Spark's. The table in docs/spark.md lists every option of Spark's
Kafka connector with what oncelog does with it.

- ``kafka.bootstrap.servers`` (required), ``kafka.<consumer setting>`` for our client under
  Kafka's dotted names (``kafka.security.protocol``, ``kafka.max.partition.fetch.bytes``);
  a name our consumer does not know is refused here, before any task runs.
  ``kafka.isolation.level`` defaults to read_committed (Spark's Kafka source: read_uncommitted).
- exactly one of ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regex that
  must match the whole name), ``assign`` (JSON ``{"topic": [0, 1]}``).
- where to start, in Spark's order of preference: ``startingTimestamp`` (ms, every partition),
  ``startingOffsetsByTimestamp`` (JSON ``{"topic": {"0": ms}}``), ``startingOffsets``
  (``earliest``, ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}``, -2 earliest, -1 latest);
  ``startingOffsetsByTimestampStrategy`` (``error`` | ``latest``) when a timestamp matches no
  record. Where to end (batch queries only): ``endingTimestamp``, ``endingOffsetsByTimestamp``,
  ``endingOffsets`` likewise (a timestamp that matches nothing ends at the latest offset).
- ``minPartitions``, ``maxRecordsPerPartition``: split partitions' offset ranges into more
  Spark tasks (Spark's KafkaOffsetRangeCalculator).
- streams: ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``, ``maxTriggerDelay`` (Spark's time
  strings: ``15m``, ``30s``, ``500ms``; default 15m).
- ``failOnDataLoss`` (default true), ``includeHeaders``, ``kafkaConsumer.pollTimeoutMs``,
  ``fetchOffset.numRetries``, ``fetchOffset.retryIntervalMs``, ``groupIdPrefix``.

Unlike Spark, which ignores an option it does not know, an unknown option (a typo such as
``startingOffset``) is refused with the option's name and the closest known one: a typo in
``startingOffsets`` would otherwise silently read from the default position.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

EARLIEST, LATEST = -2, -1

log = logging.getLogger("oncelog.spark")

# Spark's Kafka source options (Spark's spelling; matched case-insensitively).
SOURCE_OPTIONS = (
    "kafka.bootstrap.servers", "assign", "subscribe", "subscribePattern",
    "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets",
    "endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets",
    "startingOffsetsByTimestampStrategy", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions", "maxRecordsPerPartition",
    "groupIdPrefix", "includeHeaders",
)
_BATCH_ONLY = ("endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets")
_STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
# The sink's options: meaningful to format("oncelog"), not to a read.
SINK_OPTIONS = ("topic", "transactionalIdPrefix", "checkpointLocation")
# kafka.* settings Spark's Kafka source refuses, with its reasons.
_REFUSED_CLIENT = {
    "auto.offset.reset": "set the source option startingOffsets to earliest or latest instead: "
                         "the query, not the consumer, decides where it starts",
    "key.deserializer": "keys are always bytes; deserialize them with DataFrame operations",
    "value.deserializer": "values are always bytes; deserialize them with DataFrame operations",
    "enable.auto.commit": "the source commits no offsets (they live in the checkpoint)",
    "interceptor.classes": "interceptors could change the records",
}


def connection_settings(bootstrap_servers: str, client: Mapping[str, str]) -> dict[str, str]:
    """What every client of the connector needs to reach the brokers: the bootstrap list and
    the user's ``kafka.security.*`` / ``kafka.sasl.*`` settings (not the rest of ``kafka.*``,
    which is for the reading consumer or the writing producer)."""
    return {"bootstrap.servers": bootstrap_servers,
            **{k: v for k, v in client.items() if k.startswith(("security.", "sasl."))}}


class OptionError(ValueError):
    pass


@dataclass
class SourceOptions:
    bootstrap_servers: str
    subscribe: list[str] | None = None
    pattern: re.Pattern | None = None
    assign: dict[str, list[int]] | None = None
    # None: not given (Spark's defaults: latest for streams, earliest for batch reads)
    starting: str | dict[str, dict[int, int]] | None = None
    ending: str | dict[str, dict[int, int]] = "latest"
    # timestamps (ms) win over the offsets above, as in Spark: one for every partition, or
    # per partition
    starting_timestamp: int | None = None
    starting_by_timestamp: dict[str, dict[int, int]] | None = None
    ending_timestamp: int | None = None
    ending_by_timestamp: dict[str, dict[int, int]] | None = None
    # a starting timestamp that matches no record: "error" or "latest"
    by_timestamp_strategy: str = "error"
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000  # Spark's default: spark.network.timeout, 120 s
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    client: dict[str, str] = field(default_factory=dict)

    def client_config(self) -> dict[str, str]:
        """Settings for our client (dotted Kafka names)."""
        out = {"bootstrap.servers": self.bootstrap_servers,
               "isolation.level": "read_committed"}
        out.update(self.client)
        return out

    @property
    def by_timestamp_start(self) -> bool:
        return self.starting_timestamp is not None or self.starting_by_timestamp is not None

    @property
    def by_timestamp_end(self) -> bool:
        return self.ending_timestamp is not None or self.ending_by_timestamp is not None


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "false"):
        return v == "true"
    raise OptionError(f"option {name} must be true or false, not {value!r}")


def _long(name: str, value: str, minimum: int | None = None) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise OptionError(f"option {name} must be a number, not {value!r}") from None
    if minimum is not None and n < minimum:
        raise OptionError(f"option {name} must be {'positive' if minimum == 1 else f'>= {minimum}'}"
                          f", not {n}")
    return n


_TIME_UNITS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
               "d": 86_400_000}


def _duration_ms(name: str, value: str) -> int:
    """Spark's time strings (Utils.timeStringAsMs): a number and a unit (us, ms, s, m, min, h,
    d); a bare number is milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", value.lower())
    if not m or m.group(2) not in ("", *_TIME_UNITS):
        raise OptionError(f"option {name}: expected a time such as 15m, 30s or 500ms, "
                          f"got {value!r}")
    return int(int(m.group(1)) * _TIME_UNITS.get(m.group(2) or "ms", 1))


def _offsets(name: str, value: str, allow_latest: bool = True
             ) -> str | dict[str, dict[int, int]]:
    v = value.strip()
    if v.lower() in ("earliest", "latest"):
        return v.lower()
    try:
        parsed = json.loads(v)
        out = {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"option {name}: expected earliest, latest or JSON like "
                          f'{{"topic":{{"0":23,"1":-2}}}}, got {value!r}') from None
    for t, parts in out.items():
        for p, o in parts.items():
            if o < EARLIEST or (o == LATEST and not allow_latest):
                raise OptionError(f"option {name}: bad offset {o} for {t}-{p}")
    return out


def _timestamps(name: str, value: str) -> dict[str, dict[int, int]]:
    try:
        parsed = json.loads(value)
        out = {str(t): {int(p): int(ts) for p, ts in parts.items()}
               for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"option {name}: expected JSON like "
                          f'{{"topic":{{"0":1700000000000}}}}, got {value!r}') from None
    for t, parts in out.items():
        for p, ts in parts.items():
            if ts < 0:
                raise OptionError(f"option {name}: timestamp {ts} for {t}-{p} is negative")
    return out


def _timestamp(name: str, value: str) -> int:
    try:
        ts = int(value.strip())
    except ValueError:
        raise OptionError(f"option {name}: expected a timestamp in milliseconds, got "
                          f"{value!r}") from None
    if ts < 0:
        raise OptionError(f"option {name}: timestamp {ts} is negative")
    return ts


def _check_client(settings: dict[str, str]) -> None:
    """The kafka.* settings as our consumer would take them: an unknown name or a bad value is
    refused now, with the consumer's own message, not in a task later."""
    from ..client.config import consumer_config

    for name, why in _REFUSED_CLIENT.items():
        if name in settings:
            raise OptionError(f"option kafka.{name} is not supported: {why}")
    try:
        consumer_config(settings, {})
    except ValueError as exc:
        raise OptionError(f"option kafka.*: {exc}") from None


def _unknown(name: str, streaming: bool) -> str:
    if name in {s.lower() for s in SINK_OPTIONS}:
        spelled = next(s for s in SINK_OPTIONS if s.lower() == name)
        hint = " (to read a topic, use subscribe)" if name == "topic" else ""
        return f"option {spelled} is for writing to oncelog, not for reading{hint}"
    if name == "path":
        return "the oncelog source takes no path: name topics with subscribe, " \
               "subscribePattern or assign"
    close = difflib.get_close_matches(name, [s.lower() for s in SOURCE_OPTIONS], n=1)
    hint = ""
    if close:
        hint = f" (did you mean {next(s for s in SOURCE_OPTIONS if s.lower() == close[0])}?)"
    return f"unknown option {name!r} for the oncelog source{hint}"


def parse(options: Mapping[str, Any], streaming: bool = False) -> SourceOptions:
    """Check and convert a reader's options; ``streaming``: for readStream (no ending
    offsets), else for read."""
    opts = {k.lower(): str(v) for k, v in options.items()}
    known = {s.lower(): s for s in SOURCE_OPTIONS}
    for k in opts:
        if not k.startswith("kafka.") and k not in known:
            raise OptionError(_unknown(k, streaming))
    bootstrap = opts.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError("option kafka.bootstrap.servers is required")
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(given) != 1:
        raise OptionError("give exactly one of the options subscribe, subscribePattern, assign")
    if streaming:
        for name in _BATCH_ONLY:
            if name.lower() in opts:
                raise OptionError(f"{name} is for batch queries only")
    else:
        for name in _STREAM_ONLY:
            if name.lower() in opts:  # as Spark: a warning, not an error
                log.warning("option %s is ignored in batch queries", name)
    o = SourceOptions(bootstrap)
    if "subscribe" in opts:
        o.subscribe = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
        if not o.subscribe:
            raise OptionError("option subscribe names no topic")
    elif "subscribepattern" in opts:
        if not opts["subscribepattern"].strip():
            raise OptionError("option subscribePattern is empty")
        try:
            o.pattern = re.compile(opts["subscribepattern"].strip())
        except re.error as exc:
            raise OptionError(f"option subscribePattern: {exc}") from None
    else:
        try:
            parsed = json.loads(opts["assign"])
            o.assign = {str(t): [int(p) for p in ps] for t, ps in parsed.items()}
        except (ValueError, AttributeError, TypeError):
            raise OptionError('option assign: expected JSON like {"topic":[0,1]}, got '
                              f"{opts['assign']!r}") from None

    _parse_positions(o, opts, streaming)

    simple: dict[str, tuple[str, Callable[[str, str], Any]]] = {
        "failondataloss": ("fail_on_data_loss", _bool),
        "includeheaders": ("include_headers", _bool),
        "minpartitions": ("min_partitions", lambda n, v: _long(n, v, 1)),
        "maxrecordsperpartition": ("max_records_per_partition", lambda n, v: _long(n, v, 1)),
        "maxoffsetspertrigger": ("max_offsets_per_trigger", lambda n, v: _long(n, v, 1)),
        "minoffsetspertrigger": ("min_offsets_per_trigger", lambda n, v: _long(n, v, 1)),
        "maxtriggerdelay": ("max_trigger_delay_ms", _duration_ms),
        "kafkaconsumer.polltimeoutms": ("poll_timeout_ms", lambda n, v: _long(n, v, 1)),
        "fetchoffset.numretries": ("fetch_offset_retries", lambda n, v: _long(n, v, 1)),
        "fetchoffset.retryintervalms": ("fetch_offset_retry_interval_ms",
                                        lambda n, v: _long(n, v, 0)),
    }
    for key, (attr, convert) in simple.items():
        if key in opts:
            setattr(o, attr, convert(known[key], opts[key]))
    if (o.min_offsets_per_trigger is not None and o.max_offsets_per_trigger is not None
            and o.min_offsets_per_trigger > o.max_offsets_per_trigger):
        raise OptionError(f"minOffsetsPerTrigger ({o.min_offsets_per_trigger}) is higher than "
                          f"maxOffsetsPerTrigger ({o.max_offsets_per_trigger})")
    # groupIdPrefix names consumer groups; this source reads by assignment and joins none,
    # so there is nothing to name (it is accepted so that Spark jobs run unchanged).
    for k, v in opts.items():
        if k.startswith("kafka.") and k != "kafka.bootstrap.servers":
            o.client[k[len("kafka."):]] = v
    _check_client(o.client_config())
    return o


def _parse_positions(o: SourceOptions, opts: dict[str, str], streaming: bool) -> None:
    """Start and end, with Spark's order of preference: a global timestamp, then timestamps
    per partition, then offsets; the options of lower preference are ignored, as in Spark."""
    if "startingoffsetsbytimestampstrategy" in opts:
        strategy = opts["startingoffsetsbytimestampstrategy"].strip().lower()
        if strategy not in ("error", "latest"):
            raise OptionError("option startingOffsetsByTimestampStrategy must be error or "
                              f"latest, not {opts['startingoffsetsbytimestampstrategy']!r}")
        o.by_timestamp_strategy = strategy
    if "startingtimestamp" in opts:
        o.starting_timestamp = _timestamp("startingTimestamp", opts["startingtimestamp"])
    elif "startingoffsetsbytimestamp" in opts:
        o.starting_by_timestamp = _timestamps("startingOffsetsByTimestamp",
                                              opts["startingoffsetsbytimestamp"])
    elif "startingoffsets" in opts:
        o.starting = _offsets("startingOffsets", opts["startingoffsets"])
        if not streaming:
            if o.starting == "latest":
                raise OptionError("startingOffsets latest makes no sense for a batch query")
            if isinstance(o.starting, dict):
                for t, parts in o.starting.items():
                    for p, off in parts.items():
                        if off == LATEST:
                            raise OptionError(f"startingOffsets for {t}-{p} can't be latest "
                                              "(-1) for a batch query")
    if streaming:
        return
    if "endingtimestamp" in opts:
        o.ending_timestamp = _timestamp("endingTimestamp", opts["endingtimestamp"])
    elif "endingoffsetsbytimestamp" in opts:
        o.ending_by_timestamp = _timestamps("endingOffsetsByTimestamp",
                                            opts["endingoffsetsbytimestamp"])
    elif "endingoffsets" in opts:
        o.ending = _offsets("endingOffsets", opts["endingoffsets"])
        if o.ending == "earliest":
            raise OptionError("option endingOffsets cannot be earliest")
        if isinstance(o.ending, dict):
            for t, parts in o.ending.items():
                for p, off in parts.items():
                    if off == EARLIEST:
                        raise OptionError(f"endingOffsets for {t}-{p} can't be earliest (-2)")
    # As Spark's checkOffsetLimitValidity: per-partition timestamps must not end before they
    # start.
    if o.starting_by_timestamp is not None and o.ending_by_timestamp is not None:
        for t, parts in o.starting_by_timestamp.items():
            for p, ts in parts.items():
                end = o.ending_by_timestamp.get(t, {}).get(p)
                if end is not None and ts > end:
                    raise OptionError(f"{t}-{p}: startingOffsetsByTimestamp {ts} is after "
                                      f"endingOffsetsByTimestamp {end}")
    if (o.starting_timestamp is not None and o.ending_timestamp is not None
            and o.starting_timestamp > o.ending_timestamp):
        raise OptionError(f"startingTimestamp {o.starting_timestamp} is after endingTimestamp "
                          f"{o.ending_timestamp}")
