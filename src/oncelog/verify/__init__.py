"""Checking the exactly-once guarantees from the outside (``oncelog verify``).

- history.py   operations as plain records, saved as JSON lines
- checker.py   history -> verdict: lost writes, duplicates, aborted reads, torn transactions,
               non-monotonic offsets, stuck reads (hanging transactions)
"""

from .checker import ANOMALIES, Verdict, check
from .history import History, PartitionEnd, Read, ReaderEnd, Seek, Txn, Write

__all__ = ["ANOMALIES", "History", "PartitionEnd", "Read", "ReaderEnd", "Seek", "Txn", "Verdict",
           "Write", "check"]
