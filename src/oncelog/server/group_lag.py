"""Consumer-group lag: how far each group's committed offset is behind its partition's end.

As Kafka's ``kafka-consumer-groups --describe`` computes it: ``LAG = LOG-END-OFFSET -
CURRENT-OFFSET``, where the log end offset is what a ListOffsets for the latest offset answers
a read_uncommitted consumer, the high watermark. A broker knows the committed offsets of the
groups it coordinates (the ``__consumer_offsets`` partitions it leads) and the high watermarks
of the partitions it hosts; a partition hosted elsewhere has no log end offset here (``None``,
Kafka's tool prints ``-``). Transactional offsets still pending their marker are not committed
yet and are not counted, as in Kafka. The Spark sink's markers (offsets it commits for
``__oncelog_spark_batches``, a topic nothing is written to: batch ids, not positions) have no
lag (``None``), where a log end offset minus them would be negative.

The web console's Groups page (server/console/) and the ``oncelog_consumer_group_lag`` metric
family read the same figures from ``group_lags``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..spark_markers import is_marker_offset

if TYPE_CHECKING:
    from ..group.coordinator import Group
    from .ports import HostedPartitions


@dataclass(frozen=True)
class PartitionLag:
    group_id: str
    topic: str
    partition: int
    committed_offset: int
    log_end_offset: int | None  # the high watermark; None when the partition is not hosted here

    @property
    def lag(self) -> int | None:
        if self.log_end_offset is None or self.committed_offset < 0 \
                or is_marker_offset(self.topic):
            return None
        return self.log_end_offset - self.committed_offset


def group_lags(groups: Mapping[str, Group], topics: HostedPartitions,
               group_ids: Iterable[str] | None = None) -> list[PartitionLag]:
    """The lag of every committed offset of ``groups`` (the groups this broker coordinates;
    or of the named ones among them) against the partitions hosted here (``topics``),
    ordered by group, topic and partition."""
    names = sorted(groups) if group_ids is None else [g for g in group_ids if g in groups]
    out = []
    for group_id in names:
        for (topic, index), value in sorted(groups[group_id].offsets.items()):
            p = topics.partition(topic, index)
            out.append(PartitionLag(group_id, topic, index, value.offset,
                                    None if p is None else p.log.high_watermark))
    return out


def lag_samples(groups: Mapping[str, Group], topics: HostedPartitions) -> Iterator:
    """The ``oncelog_consumer_group_lag`` gauge, one sample per group and partition whose lag
    is known here (as kafka_exporter's kafka_consumergroup_lag)."""
    from .metrics import Sample

    for entry in group_lags(groups, topics):
        lag = entry.lag
        if lag is not None:
            yield Sample("oncelog_consumer_group_lag",
                         "the group's committed offset behind the partition's high watermark",
                         lag, (("group", entry.group_id), ("topic", entry.topic),
                               ("partition", str(entry.partition))))
