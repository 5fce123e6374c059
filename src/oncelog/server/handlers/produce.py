"""Produce: spec 000, "Client-Broker request handling" (the ProduceRequest steps).

Per partition: validate every batch's frame (magic 2, CRC32C, codec, record count; the records
inside and their timestamps are the log's LogValidator step, log/log.py), refuse what a client may
not write (control batches, internal topics); where a transactional batch would open its
producer's transaction, ask the transaction coordinator first (KIP-890: verify for older
clients, add the partition for Produce v12+; server/txn_verification.py); then let the log
check the producer state and append. The batch bytes are stored as received;
only the base offset (and, for LogAppendTime topics, the timestamp; for CreateTime topics a
maxTimestamp that is not the records' largest, as Kafka's LogValidator) is rewritten. A batch
refused for single records names them (KIP-467's record_errors, v8+).
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from ...log.validator import RecordsError, check_compressed
from ...protocol import millis
from ...protocol.produce_response import ProduceResponseWriter
from ...records import CorruptRecordError, split_batches
from ..context import CloseConnection, RequestContext
from ..ports import BrokerPort
from ..replication import AppendEntry, AppendError, AppendOrigin, ReplicationError
from ..topics import INTERNAL_TOPICS, TopicError, check_topic_name
from ..txn_verification import produce_error
from . import acl
from .util import error_code

log = logging.getLogger("oncelog.broker.produce")


class _Reject(Exception):
    """``at_log``: refused as the log would (Kafka's ReplicaManager append), which answers
    with the partition's log start offset for some errors; otherwise by the request's checks
    (Kafka's KafkaApis), which answer without it."""

    def __init__(self, error_name: ErrorCode, message: str, at_log: bool = True) -> None:
        super().__init__(message)
        self.error_name = error_name
        self.at_log = at_log


def _prepare(broker: BrokerPort, topic: str, index: int, records):
    """Validate one partition's record set: (partition, batches), or raise _Reject. Only the
    partition's leader appends."""
    try:  # (min.insync.replicas for acks=all: the append's own check)
        replica = broker.replication.leader_replica(topic, index)
    except ReplicationError as exc:
        if exc.error_name == ErrorCode.unknown_topic_or_partition:
            try:
                check_topic_name(topic)
            except TopicError as bad:
                raise _Reject(bad.error_name, str(bad)) from None
        raise _Reject(exc.error_name, str(exc)) from None
    partition = replica.partition
    if topic in INTERNAL_TOPICS:
        raise _Reject(ErrorCode.invalid_topic_exception, f"cannot append to internal topic {topic}")
    if not records:
        raise _Reject(ErrorCode.corrupt_message, "empty record set")
    _check_magic(records)
    try:
        batches = split_batches(records)
    except CorruptRecordError as exc:  # CORRUPT_MESSAGE, or INVALID_RECORD (a wrong count)
        raise _Reject(exc.error_name, str(exc)) from None
    for _pos, h in batches:
        if h.is_control:
            raise _Reject(ErrorCode.invalid_record, "clients may not write control batches")
        if h.is_transactional and h.producer_id < 0:
            raise _Reject(ErrorCode.invalid_record, "a transactional batch needs a producer id")
    if len(batches) > 1 and any(h.producer_id >= 0 for _, h in batches):
        raise _Reject(ErrorCode.invalid_record,
                      "an idempotent producer must send one batch per partition per request")
    return partition, batches


def _check_magic(records) -> None:
    """As Kafka reads a Produce v3+ record set before anything else (its log input stream's
    walk over the batches, then ProduceRequest.validateRecords): a batch length under the
    smallest record's overhead (14), or a magic past 2, is CORRUPT_MESSAGE; a record set with
    no whole batch in it, or a batch of magic 0 or 1, is INVALID_RECORD."""
    pos, end, whole = 0, len(records), 0
    while end - pos >= 12:
        length = int.from_bytes(records[pos + 8:pos + 12], "big", signed=True)
        if length < 14:
            raise _Reject(ErrorCode.corrupt_message, f"Record size {length} is less than the minimum "
                                             "record overhead (14)", at_log=False)
        if end - pos < 17:
            break
        magic = int.from_bytes(records[pos + 16:pos + 17], "big", signed=True)
        if magic < 0 or magic > 2:
            raise _Reject(ErrorCode.corrupt_message, f"Invalid magic found in record: {magic}",
                          at_log=False)
        if end - pos < 12 + length:
            break  # a batch cut short is no batch
        if magic != 2:
            raise _Reject(ErrorCode.invalid_record, f"a batch of magic {magic}: Produce v3 and later "
                                            "carry magic 2 batches only", at_log=False)
        whole += 1
        pos += 12 + length
    if whole == 0:
        raise _Reject(ErrorCode.invalid_record, "Produce requests with version 3 and above must have "
                                        "at least one record batch per partition", at_log=False)


_CLIENT = AppendOrigin.CLIENT  # (a global: an enum member looked up on its class costs more)

# Kafka's ReplicaManager answers these append errors without the partition's log start offset
# (handleProduceAppendException); any other error the log raises carries it.
_NO_LOG_START = {ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower, ErrorCode.message_too_large,
                 ErrorCode.record_list_too_large, ErrorCode.corrupt_message, ErrorCode.kafka_storage_error}


def _log_start(broker: BrokerPort, tp: tuple[str, int], error_name: ErrorCode) -> int:
    if error_name in _NO_LOG_START:
        return -1
    try:
        return broker.replication.leader_replica(*tp).partition.log.log_start_offset
    except ReplicationError:
        return -1


async def _verify(broker: BrokerPort, transactional_id: str | None, prepared: dict,
                  new_client: bool):
    """KIP-890: ask the coordinator about the partitions where this request's transactional
    batches would open the producer's transaction. Returns (whether appends must carry a
    verification, {tp: guard}, {tp: (error, message)})."""
    verifier = broker.txn_verifier
    if transactional_id is None or not verifier.applies(new_client):
        return False, {}, {}
    guards, producer = {}, None
    for tp, (partition, batches) in prepared.items():
        h = batches[0][1]
        if not h.is_transactional:
            continue
        producer = (h.producer_id, h.producer_epoch)
        state = partition.log.producer_state
        if state.needs_verification(*producer):
            guards[tp] = state.start_verification(*producer)
    failed = {}
    if guards and producer is not None:
        pid_epoch = producer

        def renew() -> None:
            # A retry after CONCURRENT_TRANSACTIONS: a marker of the producer's previous
            # transaction may have landed meanwhile; the guard starts again with the new ask.
            for tp in guards:
                guards[tp] = prepared[tp][0].log.producer_state.start_verification(*pid_epoch)

        answers = await verifier.check(transactional_id, producer[0], producer[1], list(guards),
                                       renew=renew,
                                       add=new_client)
        for tp, err in answers.items():
            if err is not None:
                failed[tp] = produce_error(err, new_client)
    return True, guards, failed


def _denied(broker: BrokerPort, ctx: RequestContext, request: Any, txn_id: str | None
            ) -> tuple[ErrorCode, str] | None:
    """Spec 000: transactional data needs Write on the TransactionalId; idempotent data
    IdempotentWrite on the cluster (implied by Write on a topic, KIP-679)."""
    if txn_id is not None:
        if not acl.transactional_id(broker, ctx, acl.Op.WRITE, txn_id):
            return (ErrorCode.transactional_id_authorization_failed,
                    f"not authorized to write for transactional id {txn_id}")
    elif not acl.cluster(broker, ctx, acl.Op.IDEMPOTENT_WRITE) and any(
            _has_producer_id(pd.records) for td in request.topic_data
            for pd in td.partition_data):
        return ErrorCode.cluster_authorization_failed, "not authorized for idempotent writes"
    return None


def _has_producer_id(records) -> bool:
    # The producer id sits at bytes 43-50 of a v2 batch (after base offset, length, leader
    # epoch, magic, crc, attributes, last offset delta and the two timestamps).
    return bool(records) and len(records) >= 51 and records[43:51] != b"\xff" * 8


async def handle_produce(broker: BrokerPort, ctx: RequestContext, request: Any) -> Any:
    acks = request.acks
    new_client = ctx.version >= 12  # KIP-890 transaction version 2
    results: dict[tuple[str, int], Any] = {}  # (error name, message[, record errors]) or AppendResult
    prepared: dict[tuple[str, int], tuple] = {}
    records_of: dict[tuple[str, int], Any] = {}
    txn_id = getattr(request, "transactional_id", None)
    denied = _denied(broker, ctx, request, txn_id)
    may_write = acl.topics_checker(broker, ctx, acl.Op.WRITE)
    at_log: set[tuple[str, int]] = set()  # refused by the log (not by ACLs or the coordinator)
    for td in request.topic_data:
        for pd in td.partition_data:
            tp = (td.name, pd.index)
            if acks not in (-1, 0, 1):
                results[tp] = (ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, not {acks}")
                continue
            if denied or not may_write(td.name):
                results[tp] = denied or (ErrorCode.topic_authorization_failed,
                                         f"not authorized to write to {td.name}")
                continue
            try:
                prepared[tp] = _prepare(broker, td.name, pd.index, pd.records)
                records_of[tp] = pd.records
            except _Reject as exc:
                results[tp] = (exc.error_name, str(exc))
                if exc.at_log:
                    at_log.add(tp)
    verify, guards, failed = await _verify(broker, txn_id, prepared, new_client)
    results.update(failed)
    # The records of compressed batches, read before the append: large payloads off the event
    # loop, a bomb stopped at its first bad record (log/validator.py check_compressed).
    checked: dict[tuple[str, int], dict] = {}
    for tp, (partition, batches) in prepared.items():
        if tp in failed:
            continue
        try:
            checked[tp] = await check_compressed(partition.log.config, records_of[tp], batches)
        except RecordsError as exc:
            results[tp] = (exc.error_name, str(exc), exc.record_errors)
            at_log.add(tp)
    entries = {tp: AppendEntry(records_of[tp], batches, guards.get(tp), verify, new_client,
                               checked[tp])
               for tp, (_partition, batches) in prepared.items() if tp in checked}
    appended = await broker.replication.append_records(entries, origin=_CLIENT,
                                                       required_acks=acks,
                                                       timeout_ms=millis(request.timeout))
    broker.stats.produced(appended, records_of)
    for tp, result in appended.items():
        results[tp] = (result.error_name, str(result), result.record_errors) \
            if isinstance(result, AppendError) else result
        at_log.add(tp)
    if acks == 0:
        if any(isinstance(r, tuple) for r in results.values()):
            # As Kafka: an acks=0 producer learns of a failure by the connection closing.
            raise CloseConnection("a Produce with acks=0 failed")
        return None  # acks=0: the client expects no response at all
    writer = ProduceResponseWriter(ctx.version, len(request.topic_data))
    for td in request.topic_data:
        writer.topic(td.name, len(td.partition_data))
        for pd in td.partition_data:
            r = results[(td.name, pd.index)]
            if isinstance(r, tuple):
                # KIP-467: the records of the batch the log refused one by one (v8+).
                start = _log_start(broker, (td.name, pd.index), r[0]) \
                    if (td.name, pd.index) in at_log else -1
                writer.partition(pd.index, error_code(r[0]), -1, -1, start,
                                 r[2] if len(r) > 2 else (), r[1])
            else:
                writer.partition(pd.index, 0, r.base_offset, r.log_append_time,
                                 r.log_start_offset)
        writer.end_topic()
    return writer


def answer_every_partition(version: int, request: Any, error_name: ErrorCode, message: str):
    """The Produce response naming every partition of ``request`` with one error: what Kafka's
    handleError answers when a request fails unexpectedly. (The generic error_response mirrors
    kio requests; Produce is read by hand, protocol/produce_request.py.)"""
    writer = ProduceResponseWriter(version, len(request.topic_data))
    for td in request.topic_data:
        writer.topic(td.name, len(td.partition_data))
        for pd in td.partition_data:
            writer.partition(pd.index, error_code(error_name), -1, -1, -1, (), message)
        writer.end_topic()
    return writer
