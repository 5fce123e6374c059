"""The flags of ``oncelog produce`` and ``oncelog consume`` (cli/console_tools.py): Kafka's
console producer's and consumer's names, plus kcat's ``--format`` and ``--header``."""

from __future__ import annotations

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
    p.add_argument("--compression-type", default="none",
                   choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--acks", default="all", choices=["all", "-1", "0", "1"])

    c = sub.add_parser(
        "consume", help="print records to stdout, one per line",
        description="Print records as Kafka's kafka-console-consumer.sh does (value; with "
        "--print-timestamp, --print-partition, --print-offset, --print-headers, --print-key "
        "their columns first, tab-separated: CreateTime:1700000000000, Partition:0, "
        "Offset:3, k:v,k2:v2), or as a kcat format string (--format). Ctrl-C stops "
        "cleanly; with --group, what was printed is committed.")
    add_bootstrap(c)
    c.add_argument("--topic", default=None)
    c.add_argument("--include", default=None, metavar="REGEX",
                   help="subscribe to every topic whose name matches (instead of --topic)")
    c.add_argument("--group", default=None,
                   help="consume as a member of this group, from its committed offsets, "
                   "committing what was printed")
    c.add_argument("--partition", type=int, action="append", default=None,
                   help="partition(s) to read (default: all; not with --group)")
    c.add_argument("--from-beginning", action="store_true",
                   help="start at the earliest offset instead of the end (with --group: "
                   "where the group has no committed offset)")
    c.add_argument("--offset", type=int, default=None, help="start at this offset")
    c.add_argument("--isolation-level", default="read_uncommitted",
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
