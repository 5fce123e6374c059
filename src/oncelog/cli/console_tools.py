"""``oncelog produce`` and ``oncelog consume``: Kafka's console producer and consumer.

Ctrl-C (SIGINT) or SIGTERM ends either cleanly, as Kafka's shutdown hook does: produce sends
and flushes every line it has read, consume stops after the record it is printing (with
``--group`` committing what it printed, within the consumer's close timeout), and the count is
printed on stderr. The exit status is then 128 + the signal's number (130 for Ctrl-C), as the
JVM gives Kafka's tools. A second signal while that clean end waits (a broker gone away) exits
at once, with the same status.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .args import UsageError
from .record_format import KafkaFormatter, KcatFormatter, LineReader


class _Interrupted(Exception):
    """Raised by the signal handler while the main thread waits on stdin."""


class _Stop:
    """The signal that asked the tool to stop (None while it runs). ``waiting``: the main
    thread is blocked reading stdin, which a handler that returns would not end (PEP 475
    resumes the read), so the handler raises there instead."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.waiting = False

    def handler(self, signum, frame) -> None:
        if self.signal is not None:  # a second Ctrl-C: stop waiting for the clean end
            print("Interrupted again: exiting without finishing", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signal = signum
        if self.waiting:
            self.waiting = False
            raise _Interrupted

    def exit_status(self, status: int) -> int:
        return 128 + self.signal if self.signal is not None else status


@contextmanager
def _stop_on_signals() -> Iterator[_Stop]:
    stop = _Stop()
    before = {s: signal.signal(s, stop.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def properties(pairs: list[tuple[str, str]]) -> dict[str, str]:
    return dict(pairs)


def client_properties(path: str | None, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """``--producer.config FILE`` / ``--consumer.config FILE`` with ``--producer-property`` /
    ``--consumer-property`` pairs over it, as Kafka's console tools merge them."""
    from .properties import load_properties

    props = load_properties(path) if path else {}
    props.update(pairs)
    return props


def _merge_option(props: dict, key: str, given, default) -> None:
    """Kafka's CommandLineUtils.maybeMergeOptions: a flag given on the command line wins;
    otherwise the properties' value; otherwise the flag's default."""
    if given is not None:
        props[key] = given
    else:
        props.setdefault(key, default)


# --- produce ------------------------------------------------------------------------------------

def produce(args, settings: dict) -> int:
    from .. import Producer

    props = properties(args.property)
    if args.key_separator is not None:
        props.update({"parse.key": "true", "key.separator": args.key_separator})
    reader = LineReader(props)
    static_headers = [(k, v.encode()) for k, v in args.header]
    config = client_properties(args.producer_config, args.producer_property)
    _merge_option(config, "acks", args.acks, "all")
    _merge_option(config, "compression.type", args.compression_type, "none")
    config.setdefault("client.id", "console-producer")
    count = 0
    refused = None
    futures = []
    with _stop_on_signals() as stop, Producer(config, **settings) as producer:
        lines = iter(sys.stdin.buffer)
        number = 0
        while stop.signal is None:
            try:
                stop.waiting = True
                line = next(lines, None)
            except _Interrupted:
                break
            finally:
                stop.waiting = False
            if line is None:
                break
            number += 1
            text = line.rstrip(b"\r\n").decode("utf-8", "surrogateescape")
            try:
                key, value, headers = reader.read(text, number)
            except ValueError as exc:  # as Kafka's console producer: it stops there
                refused = str(exc)
                break
            futures.append(producer.send(args.topic, value=value, key=key,
                                         partition=args.partition,
                                         headers=static_headers + headers or None,
                                         timestamp_ms=args.timestamp))
            count += 1
        producer.flush()
        for f in futures:
            f.result()
    print(f"Produced {count} records to {args.topic}.", file=sys.stderr)
    if refused is not None:
        print(f"error: {refused}", file=sys.stderr)
        return stop.exit_status(1)
    return stop.exit_status(0)


# --- consume ------------------------------------------------------------------------------------

def check_consume_args(args) -> None:
    """Kafka's ConsoleConsumerOptions checks, with its messages."""
    if (args.topic is None) == (args.include is None):
        raise UsageError("Exactly one of --include/--topic is required.")
    if args.partition is not None and args.topic is None:
        raise UsageError("The topic is required when partition is specified.")
    if args.group is not None and args.partition is not None:
        raise UsageError("Options group and partition cannot be specified together.")
    if args.from_timestamp is not None:
        if args.offset is not None:
            raise UsageError("Options from-timestamp and offset cannot be specified together.")
        args.offset = ("timestamp", args.from_timestamp)
    if args.offset is not None and args.from_beginning:
        raise UsageError("Options from-beginning and offset cannot be specified together.")
    if args.offset is not None and args.group is not None:
        raise UsageError("Options group and offset cannot be specified together (the "
                         "group's committed offsets say where to start).")
    if args.offset is not None and args.topic is None:
        raise UsageError("The topic is required when offset is specified.")
    if args.exclude_internal and args.include is None:
        raise UsageError("--exclude-internal goes with --include.")
    if args.json and args.format is not None:
        raise UsageError("Options json and format cannot be specified together.")


def consumer_settings(args) -> dict:
    """The consumer's configuration, as Kafka's ConsoleConsumerOptions builds it:
    --consumer.config, then --consumer-property over it; the group id from --group or those
    (all that name one must agree); auto.offset.reset from them, else --from-beginning
    (earliest) or latest; --isolation-level when given, else theirs, else
    read_uncommitted."""
    props = client_properties(args.consumer_config, args.consumer_property)
    groups = {g for g in (args.group, props.get("group.id")) if g is not None}
    if len(groups) > 1:
        raise UsageError("The group ids provided in different places (directly using "
                         "'--group', via '--consumer-property', or via '--consumer.config') do "
                         "not match. Detected group ids: "
                         + ", ".join(f"'{g}'" for g in sorted(groups)))
    if groups:
        args.group = groups.pop()
    reset = props.get("auto.offset.reset")
    if reset is not None and args.from_beginning and reset != "earliest":
        raise ValueError(f"Can't simultaneously specify --from-beginning and "
                         f"'auto.offset.reset={reset}', please remove one option")
    props.setdefault("auto.offset.reset", "earliest" if args.from_beginning else "latest")
    _merge_option(props, "isolation.level", args.isolation_level, "read_uncommitted")
    props.setdefault("client.id", "console-consumer")
    if args.group is None and args.include is not None:
        # As Kafka's console consumer: without --group, a group of its own that commits
        # nothing
        props["group.id"] = f"console-consumer-{random.randrange(100000)}"
        props.setdefault("enable.auto.commit", "false")
    elif args.group is not None:
        props["group.id"] = args.group
    return props


def formatter(args):
    if args.format is not None:
        return KcatFormatter(args.format)
    props = properties(args.property)
    for flag in ("key", "offset", "partition", "timestamp", "headers"):
        if getattr(args, f"print_{flag}"):
            props[f"print.{flag}"] = "true"
    return KafkaFormatter(props)


def consume(args, settings: dict, props: dict) -> int:
    """``settings``: the connection's (client_commands.connect); ``props``: the consumer's
    own (consumer_settings, with check_consume_args done)."""
    from .. import Consumer

    write = formatter(args)
    subscribe = args.group is not None or args.include is not None
    if not subscribe:
        tps = _partitions(args, settings)
    if args.json:
        write = JsonFormatter(settings)
    seen = 0
    out = sys.stdout.buffer
    with _stop_on_signals() as stop, Consumer(props, **settings) as consumer:
        if subscribe:
            if args.include is not None:
                consumer.subscribe(pattern=args.include)
            else:
                consumer.subscribe([args.topic])
        else:
            consumer.assign(tps)
            _seek(consumer, tps, args)
        last_record = time.monotonic()
        while stop.signal is None and (args.max_messages is None or seen < args.max_messages):
            records = consumer.poll(timeout=0.5)
            if not records:
                if args.timeout_ms is not None and \
                        (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
                    break
                continue
            last_record = time.monotonic()
            try:
                for i, r in enumerate(records):
                    if stop.signal is not None or \
                            (args.max_messages is not None and seen >= args.max_messages):
                        _rewind(consumer, records[i:])
                        break
                    out.write(write(r))
                    seen += 1
                out.flush()
            except BrokenPipeError:  # e.g. `oncelog consume ... | head`
                print("Unable to write to standard out, closing consumer.", file=sys.stderr)
                _rewind(consumer, records[i:])
                # Python's own flush at exit would fail on the closed pipe again
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                break
        if args.group is not None and not consumer.config.enable_auto_commit:
            consumer.commit(timeout=30)  # what was printed (else close commits it, bounded)
    print(f"Processed a total of {seen} messages", file=sys.stderr)
    return stop.exit_status(0)


def _seek(consumer, tps: list, args) -> None:
    """Where each assigned partition starts: ``--offset`` (earliest, latest, N; kcat's -N and
    s@MS; ``--from-timestamp``), else the beginning with --from-beginning, else the end."""
    spec = args.offset
    if spec is None:
        spec = "earliest" if args.from_beginning else "latest"
    if spec == "earliest":
        consumer.seek_to_beginning(*tps)
    elif spec == "latest":
        consumer.seek_to_end(*tps)
    elif isinstance(spec, int):
        for tp in tps:
            consumer.seek(tp, spec)
    elif spec[0] == "last":  # kcat's -o -N: N before the end, not before the log start
        starts, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(starts[tp], ends[tp] - spec[1]))
    else:  # a timestamp: the first record at or after it, else the end
        found = consumer.offsets_for_times(dict.fromkeys(tps, spec[1]))
        ends = consumer.end_offsets([tp for tp in tps if found.get(tp) is None])
        for tp in tps:
            consumer.seek(tp, ends[tp] if found.get(tp) is None else found[tp].offset)


class JsonFormatter:
    """kcat's -J: one JSON object per record and line: topic, partition, offset, tstype
    (create, logappend), ts, broker (the partition's leader), headers (only when the record
    has some: a flat list name, value, name, value ...), key and payload (strings, null for
    null; bytes that are not UTF-8 as U+FFFD)."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings
        self.leaders: dict[tuple[str, int], int] = {}

    def broker(self, topic: str, partition: int) -> int:
        if (topic, partition) not in self.leaders:
            from .. import Admin

            with Admin(**self.settings) as admin:
                for p in admin.describe_topics([topic])[topic].partitions:
                    self.leaders[(topic, p.partition)] = p.leader
        return self.leaders.get((topic, partition), -1)

    def __call__(self, r) -> bytes:
        import json

        def text(b: bytes | None) -> str | None:
            return None if b is None else b.decode("utf-8", "replace")

        doc: dict = {"topic": r.topic, "partition": r.partition, "offset": r.offset,
                     "tstype": "logappend" if r.timestamp_type == 1 else "create",
                     "ts": r.timestamp, "broker": self.broker(r.topic, r.partition)}
        if r.headers:
            doc["headers"] = [x for name, value in r.headers for x in (name, text(value))]
        doc["key"] = text(r.key)
        doc["payload"] = text(r.value)
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _rewind(consumer, unprinted) -> None:
    """Kafka's resetUnconsumedOffsets: each partition back to its first record not printed,
    so that the group does not commit past it."""
    from .. import TopicPartition

    first: dict = {}
    for r in unprinted:
        first.setdefault(TopicPartition(r.topic, r.partition), r.offset)
    for tp, offset in first.items():
        consumer.seek(tp, offset)


def _partitions(args, settings: dict) -> list:
    from .. import Admin, TopicPartition
    from ..errors import UnknownTopicOrPartitionError

    with Admin(**settings) as admin:
        desc = admin.describe_topics([args.topic])[args.topic]
    existing = [p.partition for p in desc.partitions]
    partitions = args.partition if args.partition is not None else existing
    for p in partitions:  # as produce refuses it: not a consumer waiting on nothing
        if p not in existing:
            raise UnknownTopicOrPartitionError(
                f"partition {p} of topic {args.topic!r} does not exist (it has "
                f"{len(existing)})")
    return [TopicPartition(args.topic, p) for p in partitions]
