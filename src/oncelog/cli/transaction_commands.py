"""``oncelog transactions ...``, as Kafka's kafka-transactions.sh: list (with the coordinator of
each id), describe, describe-producers, find-hanging, abort, and KIP-939's force-terminate.
Tables as Kafka's tool prints them (cli/table.py), with its column names."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from .table import print_json, print_table

LIST_COLUMNS = ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
DESCRIBE_COLUMNS = ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                    "TransactionState", "TransactionTimeoutMs",
                    "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"]
PRODUCERS_COLUMNS = ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                     "LastTimestamp", "CurrentTransactionStartOffset"]
HANGING_COLUMNS = ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                   "StartOffset", "LastTimestamp", "Duration(min)"]


def add_arguments(xsub, add_bootstrap: Callable[[argparse.ArgumentParser], None]) -> None:
    """The find-hanging action, and --output for the actions that print tables (the others
    are defined in cli/main.py)."""
    xh = xsub.add_parser("find-hanging", help="find hanging transactions",
                         description="Open transactions in partitions (on a broker, or of a "
                         "topic) that have lasted longer than --max-transaction-timeout and "
                         "that no coordinator will end: their producer id has no "
                         "transactional id, or its coordinator does not list the partition in "
                         "the transaction. End one with `transactions abort --start-offset`.")
    add_bootstrap(xh)
    xh.add_argument("--broker-id", type=int, default=None,
                    help="broker id to search for hanging transactions")
    xh.add_argument("--max-transaction-timeout", type=int, default=15, metavar="MINUTES",
                    help="maximum transaction timeout in minutes to limit the scope of the "
                    "search (15 minutes by default)")
    xh.add_argument("--topic", default=None,
                    help="topic name to limit search to (required if --partition is "
                    "specified)")
    xh.add_argument("--partition", type=int, default=None, help="partition number")
    for name in ("list", "describe", "describe-producers", "find-hanging"):
        xsub.choices[name].add_argument("--output", choices=["text", "json"], default="text",
                                        help="text (Kafka's table, default) or json (the "
                                        "same rows, keyed by the column names)")


def run(args, client_config: dict) -> int:
    from .. import Admin, TopicPartition

    print_rows = print_json if getattr(args, "output", "text") == "json" else print_table
    with Admin(**client_config) as admin:
        action = args.transactions_command
        if action == "list":
            print_rows(LIST_COLUMNS, [[t.transactional_id, t.coordinator_id, t.producer_id,
                                        t.state]
                                       for t in admin.list_transactions(states=args.state)])
        elif action == "describe":
            d = admin.describe_transactions([args.transactional_id])[args.transactional_id]
            now = int(time.time() * 1000)
            row: list[object] = [
                d.coordinator_id, d.transactional_id, d.producer_id, d.producer_epoch, d.state,
                d.timeout_ms, d.start_ms, now - d.start_ms if d.start_ms is not None else None,
                ",".join(f"{tp.topic}-{tp.partition}" for tp in sorted(d.partitions))]
            if print_rows is print_table:  # as Kafka's tool: no open transaction, "None"
                row = ["None" if v is None else v for v in row]
            print_rows(DESCRIBE_COLUMNS, [row])
        elif action == "describe-producers":
            tp = TopicPartition(args.topic, args.partition)
            print_rows(PRODUCERS_COLUMNS,
                        [[p.producer_id, p.producer_epoch, p.coordinator_epoch, p.last_sequence,
                          p.last_timestamp, p.current_txn_start_offset]
                         for p in admin.describe_producers([tp])[tp]])
        elif action == "find-hanging":
            return _find_hanging(admin, args, print_rows)
        elif action == "abort":
            return _abort(admin, args)
        elif action == "force-terminate":
            return _force_terminate(admin, args.transactional_id)
    return 0


def _find_hanging(admin, args, print_rows) -> int:
    """Kafka's FindHangingTransactionsCommand: the open transactions older than the maximum
    transaction timeout, of which those whose producer id no coordinator lists, or whose
    transactional id's coordinator does not hold that partition in the transaction (so it will
    never write its marker there)."""
    from .. import TopicPartition
    from ..errors import TransactionalIdNotFoundError

    if args.topic is None and args.broker_id is None:
        print("The `find-hanging` command requires either --topic or --broker-id to limit "
              "the scope of the search", file=sys.stderr)
        return 1
    if args.partition is not None and args.topic is None:
        print("The --partition argument requires --topic to be provided", file=sys.stderr)
        return 1
    if args.topic is not None and args.partition is not None:
        tps = [TopicPartition(args.topic, args.partition)]
    else:
        topics = [args.topic] if args.topic else admin.list_topics(include_internal=True)
        tps = [TopicPartition(name, p.partition)
               for name, desc in admin.describe_topics(topics).items() for p in desc.partitions
               if args.broker_id is None or args.broker_id in p.replicas]
    max_ms = args.max_transaction_timeout * 60_000
    now = int(time.time() * 1000)
    candidates = [(tp, p) for tp, states in
                  admin.describe_producers(tps, broker_id=args.broker_id).items()
                  for p in states
                  if p.current_txn_start_offset >= 0 and now - p.last_timestamp > max_ms]
    hanging = []
    if candidates:
        pids = {p.producer_id for _, p in candidates}
        txn_ids = {t.producer_id: t.transactional_id
                   for t in admin.list_transactions(producer_ids=pids) if t.producer_id in pids}
        descriptions = {}
        for txn_id in set(txn_ids.values()):
            try:
                descriptions[txn_id] = admin.describe_transactions([txn_id])[txn_id]
            except TransactionalIdNotFoundError:
                descriptions[txn_id] = None
        for tp, p in candidates:
            d = descriptions.get(txn_ids.get(p.producer_id, ""))
            if d is None or tp not in d.partitions:
                hanging.append((tp, p))
    print_rows(HANGING_COLUMNS, [[tp.topic, tp.partition, p.producer_id, p.producer_epoch,
                                   p.coordinator_epoch, p.current_txn_start_offset,
                                   p.last_timestamp, (now - p.last_timestamp) // 60_000]
                                  for tp, p in hanging])
    return 0


def _force_terminate(admin, txn_id: str) -> int:
    from ..errors import TransactionalIdNotFoundError

    try:
        before = admin.force_terminate_transaction(txn_id)
    except TransactionalIdNotFoundError:
        # Not created by mistake (a typo would otherwise register a new id and print success).
        print(f"oncelog transactions: transactional id {txn_id!r} does not exist (its "
              "coordinator does not know it); nothing was terminated", file=sys.stderr)
        return 1
    if before.state == "Ongoing":
        print(f"Terminated the transaction of {txn_id!r} (aborted; its producer is fenced).")
    else:
        print(f"Fenced the producer of {txn_id!r} (it had no open transaction to abort: "
              f"{before.state}).")
    return 0


def _abort(admin, args) -> int:
    from .. import TopicPartition

    tp = TopicPartition(args.topic, args.partition)
    given = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is not None:
        # As kafka-transactions.sh: the producer whose open transaction starts there.
        matches = [p for p in admin.describe_producers([tp])[tp]
                   if p.current_txn_start_offset == args.start_offset]
        if not matches:
            print(f"oncelog transactions: no open transaction starts at offset "
                  f"{args.start_offset} in {tp.topic}-{tp.partition}", file=sys.stderr)
            return 1
        p = matches[0]
        given = (p.producer_id, p.producer_epoch, max(p.coordinator_epoch, 0))
    elif None in given:
        print("oncelog transactions abort: give --start-offset, or --producer-id, "
              "--producer-epoch and --coordinator-epoch", file=sys.stderr)
        return 2
    pid, epoch, coordinator_epoch = given
    admin.abort_transaction(tp, pid, epoch, coordinator_epoch)
    print(f"Aborted the transaction of producer {pid} (epoch {epoch}) in "
          f"{tp.topic}-{tp.partition}.")
    return 0
