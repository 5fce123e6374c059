"""Checking the exactly-once guarantees from the outside (``oncelog verify``).

- history.py   operations as plain records, saved as JSON lines
- checker.py   history -> verdict: lost writes, duplicates, aborted reads, torn transactions,
               non-monotonic offsets, stuck reads (hanging transactions)
- proxy.py     FaultProxy: delays, holds (late messages) and duplicates Kafka requests
- raw_writer.py  a bare-wire transactional client of the old protocol or of version 2
- workload.py  writers (ours, confluent-kafka, raw) and read_committed readers
- queue_history.py  the queue history of Jepsen's Kafka workload: load, validate, merge, save
- jepsen.py    queue history -> QueueVerdict: Jepsen's Kafka checks (lost-write, G1a, G0/G1c, ...)
- cli.py       ``oncelog verify`` (its broker: harness/broker_process.py); ``--check`` reads both
               kinds of history
"""

from .checker import ANOMALIES, Verdict, check
from .history import History, PartitionEnd, Read, ReaderEnd, Seek, Txn, Write

__all__ = ["ANOMALIES", "History", "PartitionEnd", "Read", "ReaderEnd", "Seek", "Txn", "Verdict",
           "Write", "check"]
