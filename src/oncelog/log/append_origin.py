"""Who appends to a partition leader's log (Kafka's ``AppendOrigin``): what the log checks
depends on it. A follower's append (replication) is not among them: it is
``PartitionLog.append_as_follower``, private to the replica fetcher's path."""

from __future__ import annotations

import enum


class AppendOrigin(enum.Enum):
    CLIENT = "client"            # Produce: client records only (no control batch)
    COORDINATOR = "coordinator"  # __consumer_offsets / __transaction_state writes
    MARKER = "marker"            # a transaction marker: one COMMIT/ABORT control batch
