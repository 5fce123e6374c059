"""OffsetForLeaderEpoch: where a leader epoch ends in the leader's log.

A follower asks before fetching after a leader change and truncates its log there (Kafka's
truncation by leader epoch); a client asks to check its position after a leader change
(KIP-320). The answer is the largest epoch at or below the one asked for and the offset where
it ends (the start of the next epoch, or the log end for the latest), or -1/-1 when the leader
knows no such epoch.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ..context import RequestContext
from ..ports import ReplicaApiPort
from ..replication import ReplicationError
from . import acl
from .util import error_code


async def handle_offset_for_leader_epoch(broker: ReplicaApiPort, ctx: RequestContext, request: Any
                                            ) -> Any:
    mod = response_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, ctx.version)
    replica_id = getattr(request, "replica_id", -1)
    topics_out = []
    for t in request.topics:
        # Followers need ClusterAction; clients Describe on the topic.
        allowed = (acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION) if replica_id >= 0
                   else acl.topic(broker, ctx, acl.Op.DESCRIBE, t.topic))
        parts = []
        for p in t.partitions:
            err, epoch, end = None, -1, -1
            if not allowed:
                err = (ErrorCode.cluster_authorization_failed if replica_id >= 0
                       else ErrorCode.topic_authorization_failed)
            else:
                try:
                    epoch, end = broker.replication.end_offset_for_epoch(
                        t.topic, p.partition, getattr(p, "current_leader_epoch", -1),
                        p.leader_epoch)
                except ReplicationError as exc:
                    err = exc.error_name
            parts.append(make(mod.EpochEndOffset, error_code=error_code(err),
                              partition=p.partition, leader_epoch=epoch, end_offset=end))
        topics_out.append(make(mod.OffsetForLeaderTopicResult, topic=t.topic,
                               partitions=tuple(parts)))
    return make(mod.OffsetForLeaderEpochResponse, throttle_time=0, topics=tuple(topics_out))
