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
``startingOffsets`` would otherwise silently read from the default position. The sink's
options are checked the same way (``sink_settings``), on the driver. ``kafka.sasl.jaas.config``
(Kafka's JAAS line, as Spark's connector passes it to Kafka's client) becomes our client's user
name and password (``client_settings``).
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
# kafka.* settings Spark's Kafka source refuses, with its words
# (KafkaSourceProvider.validateGeneralOptions).
_REFUSED_CLIENT = {
    "auto.offset.reset": "Kafka option 'auto.offset.reset' is not supported. Instead set the "
                         "source option 'startingoffsets' to 'earliest' or 'latest' to specify "
                         "where to start. Structured Streaming manages which offsets are "
                         "consumed internally, rather than relying on the kafkaConsumer to do "
                         "it. This will ensure that no data is missed when new "
                         "topics/partitions are dynamically subscribed. Note that "
                         "'startingoffsets' only applies when a new Streaming query is "
                         "started, and that resuming will always pick up from where the query "
                         "left off. See the docs for more details.",
    "key.deserializer": "Kafka option 'key.deserializer' is not supported as keys are "
                        "deserialized as byte arrays with ByteArrayDeserializer. Use DataFrame "
                        "operations to explicitly deserialize the keys.",
    "value.deserializer": "Kafka option 'value.deserializer' is not supported as values are "
                          "deserialized as byte arrays with ByteArrayDeserializer. Use "
                          "DataFrame operations to explicitly deserialize the values.",
    "enable.auto.commit": "Kafka option 'enable.auto.commit' is not supported",
    "interceptor.classes": "Kafka option 'interceptor.classes' is not supported",
}
# kafka.* settings the sink refuses: Spark's Kafka sink's two (kafkaParamsForProducer, its
# words), and what the exactly-once sink sets itself or cannot work with.
_REFUSED_PRODUCER = {
    "key.serializer": "Kafka option 'key.serializer' is not supported as keys are serialized "
                      "with ByteArraySerializer.",
    "value.serializer": "Kafka option 'value.serializer' is not supported as value are "
                        "serialized with ByteArraySerializer.",
    "transactional.id": "Kafka option 'transactional.id' is not supported: the oncelog sink "
                        "names a transactional id per task; set the option "
                        "transactionalIdPrefix to choose their prefix",
    "transaction.two.phase.commit.enable": "Kafka option "
                        "'transaction.two.phase.commit.enable' is not supported: the oncelog "
                        "sink always writes two-phase-commit transactions (KIP-939)",
    "transaction.timeout.ms": "Kafka option 'transaction.timeout.ms' is not supported: the "
                              "oncelog sink's two-phase-commit transactions never time out "
                              "(KIP-939); the driver completes or aborts them",
    "interceptor.classes": "Kafka option 'interceptor.classes' is not supported",
}
# The sink's options besides kafka.*: its own, and the source's includeHeaders (Spark's
# writer writes a headers column whenever there is one, and ignores the option).
SINK_KNOWN = ("kafka.bootstrap.servers", *SINK_OPTIONS, "includeHeaders")


def client_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options (names already lower case) as our client's settings: the prefix
    dropped, and Kafka's ``sasl.jaas.config`` (as Spark's Kafka connector passes it to Kafka's
    client) turned into the user name and password of our client's SASL settings."""
    out = {k[len("kafka."):]: v for k, v in options.items()
           if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
    jaas = out.pop("sasl.jaas.config", None)
    if jaas is not None:
        out.update(_jaas_login(jaas, out))
    return out


def _jaas_login(text: str, settings: Mapping[str, str]) -> dict[str, str]:
    """Kafka's ``sasl.jaas.config`` (``org.apache.kafka.common.security.plain.PlainLoginModule
    required username="..." password="...";``, or ScramLoginModule) checked against
    ``sasl.mechanism`` and ``security.protocol`` as Kafka's client would use them."""
    from ..security.sasl import LOGIN_MODULES, jaas_login_module, jaas_options

    protocol = settings.get("security.protocol", "PLAINTEXT").strip().upper()
    if not protocol.startswith("SASL_"):
        raise OptionError(
            f"option kafka.sasl.jaas.config is set but kafka.security.protocol is {protocol}: "
            "set kafka.security.protocol to SASL_PLAINTEXT or SASL_SSL to log in with it")
    mechanism = settings.get("sasl.mechanism", "PLAIN").strip().upper()
    module = jaas_login_module(text)
    want = LOGIN_MODULES.get(mechanism)
    if want is None:
        return {}  # an unknown mechanism: the client refuses it, naming the ones it has
    if module != want:
        scram = module == LOGIN_MODULES["SCRAM-SHA-256"]
        hint = (" (set kafka.sasl.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512)" if scram
                else " (set kafka.sasl.mechanism to PLAIN)" if module == LOGIN_MODULES["PLAIN"]
                else "")
        raise OptionError(
            f"option kafka.sasl.jaas.config names the login module {module or '(none)'!r}, "
            f"not {want}, which kafka.sasl.mechanism={mechanism} needs{hint}")
    words = text.split()
    flags = ("required", "requisite", "sufficient", "optional")  # JAAS's control flags
    if len(words) < 2 or words[1].lower() not in flags or not text.rstrip().endswith(";"):
        raise OptionError("option kafka.sasl.jaas.config: expected Kafka's JAAS syntax, "
                          '<LoginModule> required username="..." password="...";')
    found = jaas_options(text)
    missing = [k for k in ("username", "password") if k not in found]
    if missing:
        raise OptionError(f"option kafka.sasl.jaas.config has no {' and no '.join(missing)}")
    unescape = re.compile(r"\\(.)")
    return {"sasl.plain.username": unescape.sub(r"\1", found["username"]),
            "sasl.plain.password": unescape.sub(r"\1", found["password"])}


def connection_settings(bootstrap_servers: str, client: Mapping[str, str]) -> dict[str, str]:
    """What every client of the connector needs to reach the brokers: the bootstrap list and
    the user's ``kafka.security.*`` / ``kafka.sasl.*`` / ``kafka.ssl.*`` settings (not the
    rest of ``kafka.*``, which is for the reading consumer or the writing producer)."""
    return {"bootstrap.servers": bootstrap_servers,
            **{k: v for k, v in client.items() if k.startswith(("security.", "sasl.", "ssl."))}}


class OptionError(ValueError):
    pass


def sink_settings(options: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Check a writer's options on the driver, before any task runs (Spark calls the data
    source's ``writer`` / ``streamWriter`` there): (the options, names in lower case; the
    ``kafka.*`` ones as our producer's settings).

    Spark's Kafka sink reads only the options it knows and ignores the rest; this one refuses
    a name it does not know (a typo such as ``transactionalIdPrefx`` would otherwise be
    ignored, and the sink would name its transactions from the checkpoint instead), naming the
    closest known one. Settings that would make the transactional producer fail in every task
    (``kafka.acks=1``, ``kafka.enable.idempotence=false``, a typo in a producer setting) are
    refused here too, with the reason."""
    from ..client.config import producer_config

    opts = {k.lower(): str(v) for k, v in options.items()}
    known = {s.lower(): s for s in SINK_KNOWN}
    for k in opts:
        if not k.startswith("kafka.") and k not in known:
            raise OptionError(_unknown_for_sink(k))
    if not opts.get("kafka.bootstrap.servers"):
        raise OptionError("option kafka.bootstrap.servers is required")
    client = client_settings(opts)
    for name, why in _REFUSED_PRODUCER.items():
        if name in client:
            raise OptionError(why)
    acks = client.get("acks")
    if acks is not None and acks.strip().lower() not in ("all", "-1"):
        raise OptionError(
            f"option kafka.acks={acks} is not supported by the oncelog sink: it writes exactly "
            "once, in transactions, and a transactional producer needs acks=all (-1), as "
            "Kafka's (KIP-98): a record acknowledged by the leader alone could be lost with "
            "it after the transaction committed. Leave kafka.acks out, or set it to all")
    idempotence = client.get("enable.idempotence")
    if idempotence is not None and idempotence.strip().lower() != "true":
        raise OptionError(
            f"option kafka.enable.idempotence={idempotence} is not supported by the oncelog "
            "sink: its producers are transactional, and transactions need idempotence "
            "(KIP-98). Leave it out")
    try:
        producer_config({"bootstrap.servers": opts["kafka.bootstrap.servers"], **client,
                         "transactional.id": "oncelog-sink-options",
                         "transaction.two.phase.commit.enable": "true"}, {})
    except ValueError as exc:
        why = " (the oncelog sink's producers are transactional)" if "conflicts" in str(exc) \
            else ""
        raise OptionError(f"option kafka.*: {exc}{why}") from None
    return opts, client


def _unknown_for_sink(name: str) -> str:
    source = {s.lower(): s for s in SOURCE_OPTIONS}
    if name in source:
        hint = " (to name the topic to write, use topic)" if name == "subscribe" else ""
        return f"option {source[name]} is for reading from oncelog, not for writing{hint}"
    if name == "path":
        return "the oncelog sink takes no path: name the topic with the topic option or a " \
               "topic column"
    names = [s for s in SINK_KNOWN if not s.startswith("kafka.")]
    close = difflib.get_close_matches(name, [s.lower() for s in names], n=1)
    hint = ""
    if close:
        hint = f" (did you mean {next(s for s in names if s.lower() == close[0])}?)"
    return f"unknown option {name!r} for the oncelog sink{hint}"


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
            raise OptionError(why)
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
    o.client = client_settings(opts)
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
