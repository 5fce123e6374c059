"""ListOffsets: earliest (-2), latest (-1: high watermark, or the last stable offset for
read_committed), max timestamp (-3), or the first offset at or after a timestamp."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ...records import CorruptRecordError
from ..context import RequestContext
from ..ports import ReplicaApiPort
from ..replication import ReplicationError
from . import acl
from .util import error_code

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
READ_COMMITTED = 1

log = logging.getLogger("oncelog.broker.list_offsets")


async def handle_list_offsets(broker: ReplicaApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.LIST_OFFSETS, ctx.version)
    isolation = getattr(request, "isolation_level", 0)
    topics_out = []
    for t in request.topics:
        parts_out = []
        allowed = acl.topic(broker, ctx, acl.Op.DESCRIBE, t.name)
        for p in t.partitions:
            err, ts, offset, epoch = None, -1, -1, 0
            try:  # the leader answers
                replica = broker.replication.leader_replica(
                    t.name, p.partition_index, getattr(p, "current_leader_epoch", -1))
                partition, epoch = replica.partition, replica.leader_epoch
            except ReplicationError as exc:
                partition, err = None, exc.error_name
            if not allowed:
                err = ErrorCode.topic_authorization_failed
            elif err is not None:
                pass
            elif partition is None:
                err = ErrorCode.unknown_topic_or_partition
            else:
                plog = partition.log
                if p.timestamp == LATEST:
                    offset = plog.last_stable_offset if isolation == READ_COMMITTED \
                        else plog.high_watermark
                elif p.timestamp == EARLIEST:
                    offset = plog.log_start_offset
                elif p.timestamp == MAX_TIMESTAMP:
                    ts, offset = plog.max_timestamp()
                elif p.timestamp < 0:
                    err = ErrorCode.invalid_request
                else:
                    try:
                        found = plog.offset_for_timestamp(p.timestamp)
                    except CorruptRecordError as exc:
                        # A stored batch that does not decompress within its bound (issue 16):
                        # the request gets an error, the connection and the broker go on.
                        log.warning("ListOffsets on %s-%d: %s", t.name, p.partition_index, exc)
                        found, err = None, ErrorCode.corrupt_message
                    # As Kafka: a record consumers may not read yet (past the high watermark,
                    # or the last stable offset for read_committed) is not an answer.
                    if found is not None and getattr(request, "replica_id", -1) < 0:
                        fetchable = plog.last_stable_offset if isolation == READ_COMMITTED \
                            else plog.high_watermark
                        if found[0] >= fetchable:
                            found = None
                    if found is not None:
                        offset, ts = found
            parts_out.append(make(mod.ListOffsetsPartitionResponse,
                                  partition_index=p.partition_index, error_code=error_code(err),
                                  timestamp=ts, offset=offset,
                                  leader_epoch=epoch if err is None and offset >= 0 else -1,
                                  old_style_offsets=()))
        topics_out.append(make(mod.ListOffsetsTopicResponse, name=t.name,
                               partitions=tuple(parts_out)))
    return make(mod.ListOffsetsResponse, throttle_time=0, topics=tuple(topics_out))
