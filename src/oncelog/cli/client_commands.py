"""The ``oncelog`` commands that talk to a broker through our own client."""

from __future__ import annotations

import socket
import sys
import time

from ..errors import KafkaError
from . import partition_commands


def run(args) -> int:
    try:
        if args.command == "groups":  # also consumer-groups (the same parser)
            return _consumer_groups(args)
        if args.command == "topics":
            return _topics(args)
        if args.command == "produce":
            return _produce(args)
        if args.command == "consume":
            return _consume(args)
        if args.command == "transactions":
            return _transactions(args)
        if args.command == "acls":
            return _acls(args)
        if args.command == "delete-records":
            return partition_commands.delete_records(args, connect(args))
        if args.command == "configs":
            from .configs_command import run as run_configs

            return run_configs(args, connect)
        if args.command == "consumer-groups":
            return _consumer_groups(args)
    except KafkaError as exc:
        print(f"oncelog {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"oncelog {args.command}: {exc}", file=sys.stderr)
        return 2
    except ConnectionError as exc:
        print(f"oncelog {args.command}: {exc}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as exc:
        print(f"oncelog {args.command}: cannot reach {args.bootstrap_server}: {exc}",
              file=sys.stderr)
        return 1
    raise AssertionError(args.command)


_REACHED: set[str] = set()
CONNECT_TIMEOUT_S = 5.0


def check_reachable(bootstrap_servers: str) -> None:
    """Fail at once, naming the address and what happened, when no bootstrap server takes a
    TCP connection (the clients would retry until their timeouts, then say only that a node
    was not reachable). Once per process and list."""
    if bootstrap_servers in _REACHED:
        return
    failures = []
    for address in (a.strip() for a in bootstrap_servers.split(",") if a.strip()):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)),
                                          timeout=CONNECT_TIMEOUT_S):
                _REACHED.add(bootstrap_servers)
                return
        except ValueError:
            failures.append(f"bad address {address!r} (HOST:PORT)")
        except ConnectionRefusedError:
            failures.append(f"connection refused to {address}")
        except TimeoutError:
            failures.append(f"no answer from {address} within {CONNECT_TIMEOUT_S:g} s")
        except OSError as exc:
            failures.append(f"cannot connect to {address}: {exc.strerror or exc}")
    raise ConnectionError("; ".join(failures) or "no bootstrap server given")


def connect(args) -> dict:
    """Client settings from the common flags: the bootstrap server and the security
    settings (--security-protocol, --user, --command-config: client_security.py). Checks
    first that a bootstrap server takes connections (``check_reachable``)."""
    from .client_security import security_settings

    security = security_settings(args)  # a bad --command-config fails before connecting
    check_reachable(args.bootstrap_server)
    return {"bootstrap_servers": args.bootstrap_server, **security}


def _consumer_groups(args) -> int:
    from .. import Admin
    from .group_commands import run as run_groups

    with Admin(**connect(args)) as admin:
        return run_groups(args, admin)


def _acls(args) -> int:
    from .. import Admin
    from ..security.acls import (
        AclBinding,
        AclFilter,
        Operation,
        PatternType,
        Permission,
        ResourceType,
        display,
        parse_name,
    )

    resources = [(ResourceType.TOPIC, args.topic), (ResourceType.GROUP, args.group),
                 (ResourceType.TRANSACTIONAL_ID, args.transactional_id),
                 (ResourceType.CLUSTER, "kafka-cluster" if args.cluster else None)]
    given = [(t, n) for t, n in resources if n is not None]
    pattern = parse_name(PatternType, args.resource_pattern_type)
    ops = [parse_name(Operation, o) for o in args.operation]
    with Admin(**connect(args)) as admin:
        if args.acls_command == "list":
            rtype, name = given[0] if given else (ResourceType.ANY, None)
            found = admin.describe_acls(AclFilter(
                rtype, name, pattern if given else PatternType.ANY, args.principal))
            _table(["ResourceType", "Name", "PatternType", "Principal", "Host", "Operation",
                    "Permission"],
                   [[display(b.resource_type), b.resource_name, display(b.pattern_type),
                     b.principal, b.host, display(b.operation), display(b.permission)]
                    for b in found])
            return 0
        if len(given) != 1:
            raise ValueError("give exactly one of --topic, --group, --transactional-id, "
                             "--cluster")
        rtype, name = given[0]
        if not ops:
            raise ValueError("give at least one --operation")
        bindings = []
        for perm, principals, hosts in ((Permission.ALLOW, args.allow_principal,
                                         args.allow_host),
                                        (Permission.DENY, args.deny_principal, args.deny_host)):
            for principal in principals:
                for host in hosts or ["*"]:
                    for op in ops:
                        bindings.append(AclBinding(rtype, name, pattern, principal, host, op,
                                                   perm))
        if not bindings:
            raise ValueError("give --allow-principal or --deny-principal")
        if args.acls_command == "add":
            admin.create_acls(bindings)
            print(f"Added {len(bindings)} ACL(s) for {display(rtype)} {name!r}.")
        else:
            gone = admin.delete_acls([AclFilter(b.resource_type, b.resource_name,
                                                b.pattern_type, b.principal, b.host,
                                                b.operation, b.permission) for b in bindings])
            print(f"Removed {len(gone)} ACL(s) for {display(rtype)} {name!r}.")
    return 0


def _table(header: list[str], rows: list[list[object]]) -> None:
    print("\t".join(header))
    for row in rows:
        print("\t".join(str(v) for v in row))


def _transactions(args) -> int:
    from .. import Admin, TopicPartition

    with Admin(**connect(args)) as admin:
        action = args.transactions_command
        if action == "list":
            _table(["TransactionalId", "ProducerId", "TransactionState"],
                   [[t.transactional_id, t.producer_id, t.state]
                    for t in admin.list_transactions(states=args.state)])
        elif action == "describe":
            d = admin.describe_transactions([args.transactional_id])[args.transactional_id]
            now = int(time.time() * 1000)
            _table(["TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                    "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
                    "TransactionDurationMs", "TopicPartitions"],
                   [[d.transactional_id, d.producer_id, d.producer_epoch, d.state,
                     d.timeout_ms, d.start_ms if d.start_ms is not None else "None",
                     now - d.start_ms if d.start_ms is not None else "None",
                     ",".join(f"{tp.topic}-{tp.partition}" for tp in sorted(d.partitions))]])
        elif action == "describe-producers":
            tp = TopicPartition(args.topic, args.partition)
            _table(["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                    "LastTimestamp", "CurrentTransactionStartOffset"],
                   [[p.producer_id, p.producer_epoch, p.coordinator_epoch, p.last_sequence,
                     p.last_timestamp, p.current_txn_start_offset]
                    for p in admin.describe_producers([tp])[tp]])
        elif action == "abort":
            return _abort(admin, args)
        elif action == "force-terminate":
            return _force_terminate(admin, args.transactional_id)
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


def _topics(args) -> int:
    from .. import Admin, NewTopic

    with Admin(**connect(args)) as admin:
        action = args.topics_command
        if action == "create":
            admin.create_topics([NewTopic(args.topic, num_partitions=args.partitions,
                                          replication_factor=args.replication_factor,
                                          config=dict(args.config))])
            print(f"Created topic {args.topic}.")
        elif action == "list":
            for name in sorted(admin.list_topics()):
                print(name)
        elif action == "delete":
            admin.delete_topics([args.topic])
            print(f"Deleted topic {args.topic}.")
        elif action in ("add-partitions", "alter"):
            return partition_commands.add_partitions(admin, args)
        elif action == "describe":
            names = args.topic or sorted(admin.list_topics())
            for name, desc in admin.describe_topics(names).items():
                overrides = ",".join(f"{k}={v}" for k, v in sorted(desc.config.items()))
                print(f"Topic: {name}\tPartitionCount: {len(desc.partitions)}\t"
                      f"ReplicationFactor: {len(desc.partitions[0].replicas) if desc.partitions else 0}"
                      f"\tConfigs: {overrides}")
                for p in desc.partitions:
                    print(f"\tTopic: {name}\tPartition: {p.partition}\tLeader: {p.leader}\t"
                          f"Replicas: {','.join(map(str, p.replicas))}\t"
                          f"Isr: {','.join(map(str, p.isr))}")
    return 0


def _produce(args) -> int:
    from .console_tools import produce

    return produce(args, connect(args))


def _consume(args) -> int:
    from .console_tools import consume

    return consume(args, connect(args))
