"""The ``oncelog`` command: a broker, a local cluster, topic administration, produce, consume,
dump-log.

Commands that talk to a broker take ``--bootstrap-server HOST:PORT`` (default
$ONCELOG_BOOTSTRAP_SERVER, else 127.0.0.1:9092), as Kafka's own tools do.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from ..txn.state import TransactionState
from .args import key_value

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


BOOTSTRAP_ENV = "ONCELOG_BOOTSTRAP_SERVER"


def _add_bootstrap(p: argparse.ArgumentParser, password_flag: str = "--password") -> None:
    default = os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP
    p.add_argument("--bootstrap-server", default=default, metavar="HOST:PORT",
                   help=f"broker to connect to (default ${BOOTSTRAP_ENV}, else "
                   f"{DEFAULT_BOOTSTRAP}; now {default})")
    p.add_argument("--user", default=None,
                   help=f"authenticate as this user (SASL_PLAINTEXT; password from "
                   f"{password_flag} or $ONCELOG_PASSWORD)")
    p.add_argument(password_flag, dest="password", default=None, help="the user's password")
    p.add_argument("--sasl-mechanism", default="SCRAM-SHA-512",
                   choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    p.add_argument("--security-protocol", default=None,
                   choices=["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"],
                   help="SSL / SASL_SSL: TLS to the broker (its CA from --command-config's "
                   "ssl.truststore.location, else the system's); default PLAINTEXT, "
                   "SASL_PLAINTEXT with --user")
    p.add_argument("--command-config", default=None, metavar="FILE",
                   help="client settings in a properties file, as Kafka's tools take them: "
                   "security.protocol, sasl.mechanism, sasl.jaas.config (or sasl.username, "
                   "sasl.password), ssl.truststore.location, ssl.keystore.location, "
                   "ssl.key.password ...")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oncelog",
        description="oncelog: a streaming log that speaks the Kafka protocol, exactly once.",
    )
    parser.add_argument("--version", action="version",
                        version=f"oncelog {importlib.metadata.version('oncelog')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("broker", help="run a broker in the foreground (single node, or a "
                       "member of a cluster with --zookeeper)",
                       description="Run a broker. Without --zookeeper it is a single node; with "
                       "it, a member of a replicated cluster (docs/cluster.md). SIGTERM or "
                       "Ctrl-C shuts it down cleanly (logs flushed, producer state "
                       "snapshotted).")
    from .broker_command import add_arguments as _broker_arguments

    _broker_arguments(b)

    t = sub.add_parser("topics", help="create, list, describe or delete topics",
                       description="Topics, as Kafka's kafka-topics.sh (whose action flags "
                       "--create, --list, --describe, --alter, --delete are accepted too).")
    tsub = t.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    tc = tsub.add_parser("create", help="create a topic")
    _add_bootstrap(tc)
    tc.add_argument("--topic", required=True)
    tc.add_argument("--partitions", type=int, default=1)
    tc.add_argument("--replication-factor", type=int, default=1)
    tc.add_argument("--config", action="append", type=key_value, default=[],
                    metavar="KEY=VALUE", help="a topic setting, e.g. retention.ms=60000")
    tc.add_argument("--if-not-exists", action="store_true",
                    help="if set when creating topics, the create request will not fail if "
                    "the topic already exists")
    exclude_internal = ("exclude internal topics when listing or describing topics (by "
                        "default they are included, as Kafka's)")
    tl = tsub.add_parser("list", help="list topic names")
    _add_bootstrap(tl)
    tl.add_argument("--exclude-internal", action="store_true", help=exclude_internal)
    td = tsub.add_parser("describe", help="describe topics (all if --topic is not given)")
    _add_bootstrap(td)
    td.add_argument("--topic", action="append", default=[])
    td.add_argument("--exclude-internal", action="store_true", help=exclude_internal)
    td.add_argument("--if-exists", action="store_true",
                    help="describe the topic only if it exists (a missing one is no error)")
    from .topic_describe import add_arguments as _describe_arguments

    _describe_arguments(td)
    tx = tsub.add_parser("delete", help="delete a topic")
    _add_bootstrap(tx)
    tx.add_argument("--topic", required=True)
    tx.add_argument("--if-exists", action="store_true",
                    help="delete the topic only if it exists (a missing one is no error)")
    ta = tsub.add_parser("add-partitions", aliases=["alter"],
                         help="grow a topic to more partitions (kafka-topics --alter "
                         "--partitions)")
    _add_bootstrap(ta)
    ta.add_argument("--topic", required=True)
    ta.add_argument("--partitions", type=int, required=True,
                    help="the topic's new partition count")
    ta.add_argument("--replica-assignment", default=None, metavar="B:B,B:B",
                    help="the added partitions' replicas: partitions separated by ',', broker "
                    "ids by ':' (default: the controller places them)")
    ta.add_argument("--if-exists", action="store_true",
                    help="alter the topic only if it exists (a missing one is no error)")

    dr = sub.add_parser("delete-records", help="delete a partition's records below an offset "
                        "(kafka-delete-records: its log start offset moves there)")
    _add_bootstrap(dr)
    dr.add_argument("--offset-json-file", default=None, metavar="FILE",
                    help='{"partitions": [{"topic": "t", "partition": 0, "offset": 10}], '
                    '"version": 1}')
    dr.add_argument("--topic", default=None)
    dr.add_argument("--partition", type=int, default=None,
                    help="with --topic (default: every partition of the topic)")
    dr.add_argument("--offset", type=int, default=None,
                    help="with --topic: the new first offset (-1: the high watermark)")

    from .console_args import add_parsers as _console_parsers

    _console_parsers(sub, _add_bootstrap)

    x = sub.add_parser("transactions", help="list, describe or abort transactions",
                       description="Inspect transactions, as Kafka's kafka-transactions.sh.")
    xsub = x.add_subparsers(dest="transactions_command", required=True, metavar="ACTION")
    xl = xsub.add_parser("list", help="list transactional ids and their states")
    _add_bootstrap(xl)
    xl.add_argument("--state", action="append", default=[], metavar="STATE",
                    choices=[s.display for s in TransactionState],
                    help="only these states (repeatable): "
                    + ", ".join(s.display for s in TransactionState))
    xd = xsub.add_parser("describe", help="describe a transactional id")
    _add_bootstrap(xd)
    xd.add_argument("--transactional-id", required=True)
    xp = xsub.add_parser("describe-producers",
                         help="producer state of a partition (who holds its LSO back)")
    _add_bootstrap(xp)
    xp.add_argument("--topic", required=True)
    xp.add_argument("--partition", type=int, required=True)
    from .transaction_commands import add_arguments as _transactions_arguments

    _transactions_arguments(xsub, _add_bootstrap)
    xf = xsub.add_parser("force-terminate",
                         help="abort a transactional id's open (even prepared) transaction",
                         description="KIP-939's --forceTerminateTransaction: abort the open "
                         "transaction of a transactional id, even a prepared two-phase-commit "
                         "one, and fence its producer.")
    _add_bootstrap(xf)
    xf.add_argument("--transactional-id", required=True)
    xa = xsub.add_parser("abort", help="abort a hanging transaction in a partition",
                         description="Write an ABORT marker for a producer's open transaction "
                         "in one partition. Give the producer (--producer-id, "
                         "--producer-epoch, --coordinator-epoch) or the transaction's first "
                         "offset (--start-offset), as describe-producers shows them.")
    _add_bootstrap(xa)
    xa.add_argument("--topic", required=True)
    xa.add_argument("--partition", type=int, required=True)
    xa.add_argument("--start-offset", type=int, default=None)
    xa.add_argument("--producer-id", type=int, default=None)
    xa.add_argument("--producer-epoch", type=int, default=None)
    xa.add_argument("--coordinator-epoch", type=int, default=None)

    a = sub.add_parser("acls", help="add, list or remove ACLs",
                       description="Manage ACLs, as Kafka's kafka-acls.sh: e.g. acls add "
                       "--allow-principal User:alice --operation Write --topic orders (its "
                       "action flags --add, --remove, --list are accepted too)")
    asub = a.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    for name, text in (("add", "add ACLs"), ("list", "list ACLs (all, or a resource's)"),
                       ("remove", "remove ACLs")):
        ap = asub.add_parser(name, help=text)
        _add_bootstrap(ap)
        ap.add_argument("--topic", default=None)
        ap.add_argument("--group", default=None)
        ap.add_argument("--transactional-id", default=None)
        ap.add_argument("--cluster", action="store_true")
        ap.add_argument("--resource-pattern-type", default="literal",
                        choices=["literal", "prefixed", "match", "any"])
        ap.add_argument("--allow-principal", action="append", default=[])
        ap.add_argument("--deny-principal", action="append", default=[])
        ap.add_argument("--allow-host", action="append", default=[])
        ap.add_argument("--deny-host", action="append", default=[])
        ap.add_argument("--operation", action="append", default=[],
                        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                        "IdempotentWrite, TwoPhaseCommit, All (repeatable)")
        if name == "list":
            ap.add_argument("--principal", default=None)
        if name == "remove":
            ap.add_argument("--force", action="store_true",
                            help="as kafka-acls.sh's: remove without asking (oncelog never "
                            "asks)")
    g = sub.add_parser("configs", help="describe or change topic, broker and user configs",
                       description="Topic overrides, dynamic broker configs and SCRAM users, as "
                       "Kafka's kafka-configs.sh: e.g. configs --entity-type topics --entity-name "
                       "orders --alter --add-config retention.ms=3600000,cleanup.policy=[compact,"
                       "delete]; users (KIP-554): --alter --entity-type users --entity-name alice "
                       "--add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret]' or "
                       "--delete-config SCRAM-SHA-256; --describe --entity-type users.")
    _add_bootstrap(g)
    from .configs_command import add_arguments as _configs_arguments

    _configs_arguments(g)
    from .users_command import add_arguments as _users_arguments

    _users_arguments(sub, _add_bootstrap)
    from .group_commands import add_parser as _groups_parser

    _groups_parser(sub, _add_bootstrap)

    k = sub.add_parser("cluster", help="start or stop a local cluster (ZooKeeper and brokers); "
                       "describe a running one (cluster info)",
                       description="A replicated cluster on this machine (docs/cluster.md): "
                       "`cluster up` starts it in the background, `cluster down` stops it.")
    from ..harness.local_cluster import add_arguments as _cluster_arguments

    _cluster_arguments(k)
    from .cluster_info import add_parser as _cluster_info_parser

    _cluster_info_parser(k, _add_bootstrap)

    v = sub.add_parser("verify", help="check the transactional guarantees under faults",
                       description="Run transactional writers and read_committed readers "
                       "through a fault-injecting proxy, check the history for lost writes, "
                       "duplicates, aborted reads, torn transactions, non-monotonic offsets and "
                       "stuck reads, print the verdict; exit 1 if any anomaly was found.")
    from .verify_command import add_arguments as _verify_arguments

    _verify_arguments(v)

    sub.add_parser("demo", help="the purchases pipeline on Spark (a transactional producer, "
                   "a Spark job copying exactly once, a read_committed check) through a "
                   "driver SIGKILL (oncelog demo --help)", add_help=False)

    d = sub.add_parser("dump-log", help="print the batches of a segment file",
                       description="Batches and records of segment files, and the entries of "
                       "index files, as Kafka's kafka-dump-log prints them.")
    from .dump_log import add_arguments as _dump_log_arguments

    _dump_log_arguments(d)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command; a reader that stops early (``| head``) ends it quietly, as it ends Unix
    tools: no BrokenPipeError traceback, exit status 141 (128 + SIGPIPE, what a shell shows
    for a tool that SIGPIPE ended). SIGPIPE itself stays ignored: a broker or client writing
    to a closed socket must get an error, not die."""
    try:
        status = _run(argv)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # What is still buffered for the closed pipe must not fail again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _run(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        from ..demo import main as demo

        return demo(argv[1:])
    from .kafka_style import parse

    args = parse(build_parser(), argv)
    if args.command == "broker":
        from .broker_command import run as run_broker_command

        return run_broker_command(args)
    if args.command == "cluster" and args.cluster_command != "info":
        from ..harness.local_cluster import run_command as run_cluster

        return run_cluster(args)
    if args.command == "verify":
        from .verify_command import run as run_verify

        return run_verify(args)
    if args.command == "dump-log":
        from .dump_log import run as run_dump_log

        return run_dump_log(args)
    from . import client_commands

    return client_commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
