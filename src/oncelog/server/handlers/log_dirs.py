"""DescribeLogDirs (KIP-113): the broker's log directory (oncelog has one, its data directory)
with the size of each partition it hosts, and the directory's total and usable bytes (v4,
KIP-827). ``kafka-log-dirs --describe`` and ``kafka-reassign-partitions --generate`` ask it.
Kafka requires Describe on the cluster; without it: CLUSTER_AUTHORIZATION_FAILED (v3+) and no
directory."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ...security.acls import Operation
from ..context import RequestContext
from ..ports import ReplicaApiPort
from . import acl


async def handle_describe_log_dirs(broker: ReplicaApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DESCRIBE_LOG_DIRS, ctx.version)
    if not acl.cluster(broker, ctx, Operation.DESCRIBE):
        return make(mod.DescribeLogDirsResponse, throttle_time=0,
                    error_code=ErrorCode.cluster_authorization_failed, results=())
    if request.topics is None:  # every partition hosted here
        wanted = list(broker.topics.all_partitions())
    else:
        wanted = [p for t in request.topics for i in t.partitions
                  if (p := broker.topics.partition(t.topic, i)) is not None]
    by_topic: dict[str, list] = {}
    for p in wanted:
        by_topic.setdefault(p.topic, []).append(make(
            mod.DescribeLogDirsPartition, partition_index=p.index,
            partition_size=p.log.size_bytes, offset_lag=0, is_future_key=False))
    log_dir = os.path.abspath(broker.topics.data_dir)
    total = usable = -1
    with contextlib.suppress(OSError):
        usage = shutil.disk_usage(log_dir)
        total, usable = usage.total, usage.free
    result = make(mod.DescribeLogDirsResult, error_code=0, log_dir=log_dir,
                  topics=tuple(make(mod.DescribeLogDirsTopic, name=name, partitions=tuple(ps))
                               for name, ps in by_topic.items()),
                  total_bytes=total, usable_bytes=usable)
    return make(mod.DescribeLogDirsResponse, throttle_time=0, error_code=0, results=(result,))
