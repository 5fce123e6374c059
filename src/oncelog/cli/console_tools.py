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


# --- produce ------------------------------------------------------------------------------------

def produce(args, settings: dict) -> int:
    from .. import Producer

    props = properties(args.property)
    if args.key_separator is not None:
        props.update({"parse.key": "true", "key.separator": args.key_separator})
    reader = LineReader(props)
    static_headers = [(k, v.encode()) for k, v in args.header]
    acks = "all" if args.acks in ("all", "-1") else int(args.acks)
    count = 0
    refused = None
    futures = []
    with _stop_on_signals() as stop, \
            Producer(**settings, acks=acks, enable_idempotence=acks == "all",
                     compression_type=args.compression_type) as producer:
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
        raise ValueError("Exactly one of --include/--topic is required.")
    if args.partition is not None and args.topic is None:
        raise ValueError("The topic is required when partition is specified.")
    if args.group is not None and args.partition is not None:
        raise ValueError("Options group and partition cannot be specified together.")
    if args.offset is not None and args.from_beginning:
        raise ValueError("Options from-beginning and offset cannot be specified together.")
    if args.offset is not None and args.group is not None:
        raise ValueError("Options group and offset cannot be specified together (the "
                         "group's committed offsets say where to start).")


def formatter(args):
    if args.format is not None:
        return KcatFormatter(args.format)
    props = properties(args.property)
    for flag in ("key", "offset", "partition", "timestamp", "headers"):
        if getattr(args, f"print_{flag}"):
            props[f"print.{flag}"] = "true"
    return KafkaFormatter(props)


def consume(args, settings: dict) -> int:
    from .. import Consumer

    check_consume_args(args)
    write = formatter(args)
    config = dict(settings, isolation_level=args.isolation_level,
                  client_id="console-consumer")
    subscribe = args.group is not None or args.include is not None
    if subscribe:
        # As Kafka's console consumer: without --group, a group of its own that commits
        # nothing; where a group has no committed offset, the end (or --from-beginning).
        config.update(group_id=args.group or f"console-consumer-{random.randrange(100000)}",
                      auto_offset_reset="earliest" if args.from_beginning else "latest")
        if args.group is None:
            config["enable_auto_commit"] = False
    else:
        tps = _partitions(args, settings)
    seen = 0
    out = sys.stdout.buffer
    with _stop_on_signals() as stop, Consumer(**config) as consumer:
        if subscribe:
            if args.include is not None:
                consumer.subscribe(pattern=args.include)
            else:
                consumer.subscribe([args.topic])
        else:
            consumer.assign(tps)
            if args.offset is not None:
                for tp in tps:
                    consumer.seek(tp, args.offset)
            elif args.from_beginning:
                consumer.seek_to_beginning(*tps)
            else:
                consumer.seek_to_end(*tps)
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
