"""Helpers shared by the tests (and some benchmarks): test modules import these, never each other.

- raw_wire       RawConnection: exact bytes on the Kafka wire, request builders, error codes
- wire_fuzz      the wire fuzzer's inputs (also a script: ``python tests/support/wire_fuzz.py``)
- floods         clients that flood a broker process, and its resident memory
- interop        third-party clients producing and reading a record set
- fake_broker    FakeBroker (scripted answers) and librdkafka's MockCluster, for client tests
- transactions   reading what is committed, as a read_committed consumer of ours
- purchases_app  spec 001's purchases app as a child process
- security       SASL users, broker settings, ACL grants, a raw SASL login
- cli            the ``oncelog`` command as users run it, and a broker process for it
- spark_tasks    Spark's part played with processes: task attempts against the sink
- waiting        wait_until: poll a condition with a deadline
- zookeeper      require_zookeeper: skip where Debian's ZooKeeper is not installed
- inmemory       the client's TransactionManager joined to the coordinator core, without sockets
- logs           a PartitionLog opened as the broker opens it, its high watermark moved as the
                 replica manager moves it (the log's unit tests)

The broker launcher itself is oncelog.harness.broker_process (the CLI and ``oncelog verify`` use
it too).
"""
