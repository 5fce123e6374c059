"""The flags of ``oncelog produce`` and ``oncelog consume`` (cli/console_tools.py): Kafka's
console producer's and consumer's names, plus kcat's ``--format`` and ``--header``."""

from __future__ import annotations

import argparse

from .args import key_value, property_value

PRODUCE_PROPERTIES = ("parse.key, key.separator, parse.headers, headers.delimiter, "
                      "headers.separator, headers.key.separator, null.marker, ignore.error")
CONSUME_PROPERTIES = ("print.timestamp, print.partition, print.offset, print.headers, "
                      "print.key, print.value, key.separator, line.separator, "
                      "headers.separator, null.literal")


def add_parsers(sub, add_bootstrap) -> None:
    p = sub.add_parser(
        "produce", help="produce lines from stdin, one record per line",
        description="Each line of stdin is a record, as Kafka's kafka-console-producer.sh "
        "reads them: [headers<TAB>][key<TAB>]value with --property parse.headers=true "
        "(headers k:v,k2:v2) and parse.key=true. Ctrl-C sends what was read, then stops.")
    add_bootstrap(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, default=None)
    p.add_argument("--key-separator", default=None,
                   help="split each line into key and value at the first occurrence "
                   "(--property parse.key=true key.separator=SEP); a line without it stops "
                   "the producer with an error, as Kafka's console producer does (the lines "
                   "before it are sent)")
    p.add_argument("--property", action="append", type=property_value, default=[],
                   metavar="KEY=VALUE", help="the line reader's settings, as Kafka's: "
                   + PRODUCE_PROPERTIES + " (repeatable)")
    p.add_argument("--header", action="append", type=key_value, default=[],
                   metavar="KEY=VALUE", help="a header on every record, as kcat's -H "
                   "(repeatable)")
    p.add_argument("--timestamp", type=int, default=None, metavar="MS",
                   help="the records' CreateTime, in milliseconds since the epoch "
                   "(default: now)")
    p.add_argument("--compression-type", "--compression-codec", default=None,
                   choices=["none", "gzip", "snappy", "lz4", "zstd"],
                   help="default none (or compression.type of --producer-property / "
                   "--producer.config)")
    p.add_argument("--acks", "--request-required-acks", default=None,
                   choices=["all", "-1", "0", "1"],
                   help="default all (or acks of --producer-property / --producer.config)")
    p.add_argument("--producer-property", action="append", type=key_value, default=[],
                   metavar="KEY=VALUE", help="a producer setting under Kafka's name, e.g. "
                   "linger.ms=50 (repeatable; wins over --producer.config)")
    p.add_argument("--producer.config", dest="producer_config", default=None, metavar="FILE",
                   help="producer settings in a properties file (Kafka's names)")

    c = sub.add_parser(
        "consume", help="print records to stdout, one per line",
        description="Print records as Kafka's kafka-console-consumer.sh does (value; with "
        "--print-timestamp, --print-partition, --print-offset, --print-headers, --print-key "
        "their columns first, tab-separated: CreateTime:1700000000000, Partition:0, "
        "Offset:3, k:v,k2:v2), or as a kcat format string (--format). Ctrl-C stops "
        "cleanly; with --group, what was printed is committed.")
    add_bootstrap(c)
    c.add_argument("--topic", default=None)
    c.add_argument("--include", "--whitelist", default=None, metavar="REGEX",
                   help="subscribe to every topic whose name matches (instead of --topic)")
    c.add_argument("--exclude-internal", action="store_true",
                   help="with --include: leave out internal topics (__consumer_offsets, "
                   "__transaction_state); oncelog's consumer always does, as Kafka's with "
                   "exclude.internal.topics=true, its default")
    c.add_argument("--group", default=None,
                   help="consume as a member of this group, from its committed offsets, "
                   "committing what was printed")
    c.add_argument("--partition", type=int, action="append", default=None,
                   help="partition(s) to read (default: all; not with --group)")
    c.add_argument("--from-beginning", action="store_true",
                   help="start at the earliest offset instead of the end (with --group: "
                   "where the group has no committed offset)")
    c.add_argument("--offset", type=offset_spec, default=None, metavar="OFFSET",
                   help="where to start in each partition read: earliest, latest, N (an "
                   "offset) as Kafka's console consumer, or kcat's -N (the last N records "
                   "of each partition) and s@MS (the first record at or after that "
                   "timestamp); not with --group")
    c.add_argument("--from-timestamp", type=timestamp_spec, default=None,
                   metavar="MS|YYYY-MM-DDTHH:mm:SS",
                   help="start at each partition's first record at or after this time "
                   "(milliseconds since the epoch, or an ISO date-time, UTC unless a zone "
                   "follows); the same as --offset s@MS")
    c.add_argument("--consumer-property", "--command-property", action="append",
                   type=key_value, default=[], metavar="KEY=VALUE",
                   help="a consumer setting under Kafka's name, e.g. fetch.max.bytes=1048576 "
                   "(repeatable; wins over --consumer.config)")
    c.add_argument("--consumer.config", dest="consumer_config", default=None, metavar="FILE",
                   help="consumer settings in a properties file (Kafka's names)")
    c.add_argument("--json", "-J", action="store_true",
                   help="one JSON object per record, as kcat -J prints them: topic, "
                   "partition, offset, tstype, ts, broker, headers, key, payload")
    c.add_argument("--isolation-level", default=None,
                   choices=["read_uncommitted", "read_committed"])
    c.add_argument("--max-messages", type=int, default=None, help="exit after this many")
    c.add_argument("--timeout-ms", type=int, default=None,
                   help="exit after this long without a new record")
    for flag, text in (("timestamp", "CreateTime:MS (or LogAppendTime:MS)"),
                       ("partition", "Partition:P"), ("offset", "Offset:O"),
                       ("headers", "k:v,k2:v2 (or NO_HEADERS)"), ("key", "the key")):
        c.add_argument(f"--print-{flag}", action="store_true", help=f"print {text}")
    c.add_argument("--property", "--formatter-property", action="append", type=property_value,
                   default=[], metavar="KEY=VALUE",
                   help="the formatter's settings, as Kafka's: " + CONSUME_PROPERTIES)
    c.add_argument("--format", default=None, metavar="FMT",
                   help=r"kcat's -f: %%t topic, %%p partition, %%o offset, %%k key, %%s "
                   r"value, %%K/%%S their lengths, %%T timestamp, %%h headers, \n \t; e.g. "
                   r"'%%t [%%p] @%%o: %%k=%%s\n'")


EARLIEST, LATEST = "earliest", "latest"


def offset_spec(text: str) -> str | int | tuple[str, int]:
    """``--offset``: ``earliest``, ``latest``, ``N`` (an offset), ``-N`` (kcat's: N records
    before the end) or ``s@MS`` (kcat's: a timestamp)."""
    word = text.strip().lower()
    if word in (EARLIEST, LATEST):
        return word
    if word.startswith("s@"):
        return ("timestamp", timestamp_spec(word[2:]))
    try:
        number = int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"The provided offset value '{text}' is incorrect. Valid values are 'earliest', "
            "'latest', a non-negative long, -N (the last N records) or s@TIMESTAMP_MS"
        ) from None
    return ("last", -number) if number < 0 else number


def timestamp_spec(text: str) -> int:
    """Milliseconds since the epoch, or an ISO-8601 date-time (UTC unless a zone is given)."""
    from datetime import UTC, datetime

    if text.strip().isdigit():
        return int(text.strip())
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected milliseconds since the epoch or YYYY-MM-DDTHH:mm:SS[.sss] "
            "with an optional zone") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
