"""The ``oncelog`` commands that talk to a broker through our own client."""

from __future__ import annotations

import sys
import time

from ..errors import KafkaError


def run(args) -> int:
    try:
        if args.command == "topics":
            return _topics(args)
        if args.command == "produce":
            return _produce(args)
        if args.command == "consume":
            return _consume(args)
    except KafkaError as exc:
        print(f"oncelog {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as exc:
        print(f"oncelog {args.command}: cannot reach {args.bootstrap_server}: {exc}",
              file=sys.stderr)
        return 1
    raise AssertionError(args.command)


def _topics(args) -> int:
    from .. import Admin, NewTopic

    with Admin(bootstrap_servers=args.bootstrap_server) as admin:
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
    from .. import Producer

    acks = "all" if args.acks in ("all", "-1") else int(args.acks)
    count = 0
    with Producer(bootstrap_servers=args.bootstrap_server, acks=acks,
                  enable_idempotence=acks == "all",
                  compression_type=args.compression_type) as producer:
        futures = []
        for line in sys.stdin.buffer:
            line = line.rstrip(b"\r\n")
            key = None
            if args.key_separator is not None:
                sep = args.key_separator.encode()
                if sep in line:
                    key, line = line.split(sep, 1)
            futures.append(producer.send(args.topic, value=line, key=key,
                                         partition=args.partition))
            count += 1
        producer.flush()
        for f in futures:
            f.result()
    print(f"Produced {count} records to {args.topic}.", file=sys.stderr)
    return 0


def _consume(args) -> int:
    from .. import Admin, Consumer, TopicPartition

    if args.partition is not None:
        partitions = args.partition
    else:
        with Admin(bootstrap_servers=args.bootstrap_server) as admin:
            desc = admin.describe_topics([args.topic])[args.topic]
            partitions = [p.partition for p in desc.partitions]
    tps = [TopicPartition(args.topic, p) for p in partitions]
    seen = 0
    out = sys.stdout
    with Consumer(bootstrap_servers=args.bootstrap_server,
                  isolation_level=args.isolation_level) as consumer:
        consumer.assign(tps)
        if args.offset is not None:
            for tp in tps:
                consumer.seek(tp, args.offset)
        elif args.from_beginning:
            consumer.seek_to_beginning(*tps)
        else:
            consumer.seek_to_end(*tps)
        last_record = time.monotonic()
        while args.max_messages is None or seen < args.max_messages:
            records = consumer.poll(timeout=0.5)
            if not records:
                if args.timeout_ms is not None and \
                        (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
                    break
                continue
            last_record = time.monotonic()
            for r in records:
                parts = []
                if args.print_offset:
                    parts.append(f"{r.partition}:{r.offset}")
                if args.print_key:
                    parts.append("null" if r.key is None else
                                 r.key.decode("utf-8", "backslashreplace"))
                parts.append("null" if r.value is None else
                             r.value.decode("utf-8", "backslashreplace"))
                out.write("\t".join(parts) + "\n")
                seen += 1
                if args.max_messages is not None and seen >= args.max_messages:
                    break
            out.flush()
    print(f"Processed a total of {seen} messages", file=sys.stderr)
    return 0
