"""The ``oncelog`` commands that talk to a broker through our own client."""

from __future__ import annotations

import os
import sys

from ..client.reachable import SaslRequiredError, check_reachable
from ..errors import KafkaError
from . import partition_commands
from .args import UsageError
from .errors import describe as describe_error
from .errors import sasl_message, show_retries
from .table import print_table


def run(args) -> int:
    show_retries(args.command)
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
            from .transaction_commands import run as run_transactions

            return run_transactions(args, connect(args))
        if args.command == "acls":
            return _acls(args)
        if args.command == "delete-records":
            return partition_commands.delete_records(args, connect(args))
        if args.command == "configs":
            from .configs_command import run as run_configs

            return run_configs(args, connect)
        if args.command == "users":
            from .. import Admin
            from .users_command import run as run_users

            with Admin(**connect(args)) as admin:
                return run_users(args, admin)
        if args.command == "consumer-groups":
            return _consumer_groups(args)
        if args.command == "cluster":  # cluster info (up and down are not a client's)
            from .. import Admin
            from .cluster_info import run as run_cluster_info

            with Admin(**connect(args)) as admin:
                return run_cluster_info(args, admin)
    except KafkaError as exc:
        print(f"oncelog {args.command}: {describe_error(exc, args)}", file=sys.stderr)
        return 1
    except UsageError as exc:  # with the (sub)command's usage, exit 2, as argparse's own
        if getattr(args, "_parser", None) is None:
            raise
        args._parser.error(str(exc))
    except ValueError as exc:
        print(f"oncelog {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while waiting on a broker: stop, no traceback
        print(f"oncelog {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (| head): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as main() ends any command: 128 + SIGPIPE, what Unix tools show
    except ConnectionError as exc:
        print(f"oncelog {args.command}: {exc}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as exc:
        print(f"oncelog {args.command}: cannot reach {args.bootstrap_server}: "
              f"{getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug of ours: say so in a line, the traceback on request
        if os.environ.get("ONCELOG_DEBUG"):
            raise
        print(f"oncelog {args.command}: unexpected error ({exc or 'no message'}); "
              "ONCELOG_DEBUG=1 shows where", file=sys.stderr)
        return 1
    raise AssertionError(args.command)


def connect(args) -> dict:
    """Client settings from the common flags: the bootstrap server and the security
    settings (--security-protocol, --user, --command-config: client_security.py). Checks
    first that a bootstrap server takes connections (``check_reachable``), and, for a
    plaintext connection, that the broker does not want SASL first."""
    from .client_security import security_settings

    security = security_settings(args)  # a bad --command-config fails before connecting
    protocol = security.get("security_protocol", "PLAINTEXT")
    try:
        check_reachable(args.bootstrap_server, without_credentials=protocol == "PLAINTEXT",
                        tls=protocol in ("SSL", "SASL_SSL"))
    except SaslRequiredError as exc:
        raise ConnectionError(sasl_message(exc.address)) from None
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
            print_table(["ResourceType", "Name", "PatternType", "Principal", "Host",
                         "Operation", "Permission"],
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


def _topics(args) -> int:
    """kafka-topics.sh's actions. ``--if-not-exists`` (create), ``--if-exists`` (delete,
    alter, describe): a topic that already exists, or does not, is no error, as Kafka's.
    ``list`` and ``describe`` include internal topics unless ``--exclude-internal``."""
    from .. import Admin, NewTopic
    from ..errors import TopicAlreadyExistsError

    with Admin(**connect(args)) as admin:
        action = args.topics_command
        if action == "create":
            try:
                admin.create_topics([NewTopic(args.topic, num_partitions=args.partitions,
                                              replication_factor=args.replication_factor,
                                              config=dict(args.config))])
            except TopicAlreadyExistsError:
                if not args.if_not_exists:
                    raise
                return 0
            print(f"Created topic {args.topic}.")
            return 0
        if action == "list":
            for name in admin.list_topics(include_internal=not args.exclude_internal):
                print(name)
            return 0
        if getattr(args, "if_exists", False):
            present = set(admin.list_topics(include_internal=True))
            if action != "describe":
                if args.topic not in present:
                    return 0
            elif not args.topic:
                raise UsageError("--topic is required to describe a topic with --if-exists")
            else:
                args.topic = [t for t in args.topic if t in present]
                if not args.topic:
                    return 0
        if action == "delete":
            admin.delete_topics([args.topic])
            print(f"Deleted topic {args.topic}.")
        elif action in ("add-partitions", "alter"):
            return partition_commands.add_partitions(admin, args)
        elif action == "describe":
            from .topic_describe import describe

            return describe(admin, args)
    return 0


def _produce(args) -> int:
    from .console_tools import produce

    return produce(args, connect(args))


def _consume(args) -> int:
    from .console_tools import check_consume_args, consume, consumer_settings

    props = consumer_settings(args)  # the flags are checked before connecting, as Kafka's
    check_consume_args(args)
    return consume(args, connect(args), props)
