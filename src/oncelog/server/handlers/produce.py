"""Produce: spec 000, "Client-Broker request handling" (the ProduceRequest steps).

Per partition: validate every batch (magic 2, CRC32C, record count), refuse what a client may
not write (control batches, internal topics),
then let the log check the producer state and append. The batch bytes are stored as received;
only the base offset (and, for LogAppendTime topics, the timestamp) is rewritten.
"""

from __future__ import annotations

import logging

from ...log import LogAppendError, LogWriteError
from ...protocol import ApiKey, make, response_module
from ...records import CorruptRecordError, split_batches
from ..clock import now_ms
from ..topics import INTERNAL_TOPICS, TopicError, check_topic_name
from .util import error_code

log = logging.getLogger("oncelog.broker.produce")


class _Reject(Exception):
    def __init__(self, error_name: str, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


def _append(broker, topic: str, index: int, records, now: int):
    partition = broker.topics.partition(topic, index)
    if partition is None:
        try:
            check_topic_name(topic)
        except TopicError as exc:
            raise _Reject(exc.error_name, str(exc)) from None
        raise _Reject("unknown_topic_or_partition", f"{topic}-{index} is not hosted here")
    if topic in INTERNAL_TOPICS:
        raise _Reject("invalid_topic_exception", f"cannot append to internal topic {topic}")
    if not records:
        raise _Reject("corrupt_message", "empty record set")
    try:
        batches = split_batches(records)
    except CorruptRecordError as exc:
        raise _Reject("corrupt_message", str(exc)) from None
    for _pos, h in batches:
        if h.is_control:
            raise _Reject("invalid_record", "clients may not write control batches")
        if h.is_transactional and h.producer_id < 0:
            raise _Reject("invalid_record", "a transactional batch needs a producer id")
    if len(batches) > 1 and any(h.producer_id >= 0 for _, h in batches):
        raise _Reject("invalid_record",
                      "an idempotent producer must send one batch per partition per request")
    try:
        result = partition.log.append(bytearray(records), batches, now)
    except LogAppendError as exc:
        raise _Reject(exc.error_name, str(exc)) from None
    except LogWriteError as exc:
        log.error("append to %s-%d failed: %s", topic, index, exc)
        raise _Reject("kafka_storage_error", f"the log could not be written: {exc}") from None
    if not result.duplicate:
        partition.notify_append()
    return result


async def handle_produce(broker, ctx, request):
    acks = request.acks
    mod = response_module(ApiKey.PRODUCE, ctx.version)
    now = now_ms()
    topics_out = []
    for td in request.topic_data:
        parts_out = []
        for pd in td.partition_data:
            err, msg = None, None
            base_offset, append_time, start = -1, -1, -1
            if acks not in (-1, 0, 1):
                err, msg = "invalid_required_acks", f"acks must be -1, 0 or 1, not {acks}"
            else:
                try:
                    result = _append(broker, td.name, pd.index, pd.records, now)
                    base_offset = result.base_offset
                    append_time = result.log_append_time
                    start = result.log_start_offset
                except _Reject as exc:
                    err, msg = exc.error_name, str(exc)
            parts_out.append(make(
                mod.PartitionProduceResponse, index=pd.index, error_code=error_code(err),
                base_offset=base_offset, log_append_time=append_time, log_start_offset=start,
                record_errors=(), error_message=msg,
            ))
        topics_out.append(make(mod.TopicProduceResponse, name=td.name,
                               partition_responses=tuple(parts_out)))
    if acks == 0:
        return None  # acks=0: the client expects no response at all
    return make(mod.ProduceResponse, responses=tuple(topics_out), throttle_time=0)
