"""``oncelog dump-log`` on what compaction leaves: cleaned batches with their delete horizon,
the internal topics' records decoded (Kafka's --transaction-log-decoder, --offsets-decoder),
and index, time index, aborted-transaction index and producer snapshot files printed as the
entries they hold."""

from __future__ import annotations

from support.cli import oncelog
from support.logs import advance_high_watermark, open_log

from oncelog.group.log_format import OffsetKey, OffsetValue, encode_key, encode_offset
from oncelog.log import LogConfig
from oncelog.log.cleaner_manager import CleanerManager
from oncelog.log.log_cleaner import clean_log
from oncelog.records import build_batch, split_batches
from oncelog.txn import log_format as txn_format
from oncelog.txn.state import TransactionMetadata


def _append(plog, records, now, **kw):
    data = bytearray(build_batch([(k, v, [], now) for k, v in records], **kw))
    plog.append(data, split_batches(data), now)
    advance_high_watermark(plog)  # a single node's replica manager


def test_dump_log_shows_cleaned_batches_and_index_files(tmp_path):
    cfg = LogConfig(segment_bytes=400, cleanup_policy=frozenset({"compact"}),
                    delete_retention_ms=1000, min_cleanable_dirty_ratio=0.0)
    plog = open_log(tmp_path / "t-0", cfg)
    t = 1_000_000
    _append(plog, [(b"a", b"1"), (b"b", b"1")], t)
    _append(plog, [(b"a", None)], t)  # a tombstone
    _append(plog, [(b"c", b"x")], t, producer_id=5, producer_epoch=0, base_sequence=0,
            is_transactional=True)
    plog.append_marker(5, 0, False, 0, t)
    advance_high_watermark(plog)
    for i in range(8):
        _append(plog, [(b"d", b"y" * 60 + str(i).encode())], t)
    manager = CleanerManager()
    ltc = manager.log_to_clean("t-0", plog, t)
    manager.state(plog).in_progress = True
    assert clean_log(manager, ltc, t, 1 << 20) is not None
    plog.close(t)
    seg = tmp_path / "t-0" / "00000000000000000000.log"
    out = oncelog("dump-log", str(seg), "--print-data").stdout
    # Kafka prints RecordBatch.deleteHorizonMs(), an OptionalLong
    assert f"deleteHorizonMs: OptionalLong[{t + 1000}]" in out  # the tombstone's, stamped
    assert "deleteHorizonMs: OptionalLong.empty" in out
    assert "endTxnMarker: ABORT" in out
    index = oncelog("dump-log", str(seg.with_suffix(".index"))).stdout.splitlines()
    assert index[1].startswith("offset: ") and "position: 0" in index[1]
    timeindex = oncelog("dump-log", str(seg.with_suffix(".timeindex"))).stdout
    assert f"timestamp: {t}" in timeindex
    txnindex = oncelog("dump-log", str(seg.with_suffix(".txnindex"))).stdout
    assert "producerId: 5 firstOffset: 3 lastOffset: 4" in txnindex
    snapshot = max((tmp_path / "t-0").glob("*.snapshot"))
    snap = oncelog("dump-log", str(snapshot)).stdout
    assert "producerId: 5 producerEpoch: 0" in snap
    for line in index + timeindex.splitlines() + txnindex.splitlines():
        assert "torn" not in line and "truncated" not in line


def test_dump_log_decodes_the_internal_topics(tmp_path):
    offsets = tmp_path / "offsets.log"
    offsets.write_bytes(build_batch([
        (encode_key(OffsetKey("g", "orders", 3)), encode_offset(OffsetValue(42, 7, "meta", 1234)), [], 1),
        (encode_key(OffsetKey("g", "orders", 4)), None, [], 1),
    ]))
    out = oncelog("dump-log", "--offsets-decoder", str(offsets)).stdout
    # Kafka's JSON: the key's version as "type", the value's as "version"
    assert 'key: {"type":"1","data":{"group":"g","topic":"orders","partition":3}} ' \
        'payload: {"version":"3","data":{"offset":42,"leaderEpoch":7,"metadata":"meta",' \
        '"commitTimestamp":1234}}' in out
    assert 'key: {"type":"1","data":{"group":"g","topic":"orders","partition":4}} ' \
        "payload: <DELETE>" in out
    from oncelog.client.consumer.assignors import (
        Subscription,
        encode_assignment,
        encode_subscription,
    )
    from oncelog.client.types import TopicPartition
    from oncelog.group.log_format import GroupKey, GroupValue, MemberValue, encode_group

    member = MemberValue("m-1", None, "c", "/127.0.0.1", 300_000, 45_000,
                         encode_subscription(Subscription(("orders",))),
                         encode_assignment([TopicPartition("orders", 0)]))
    groups = tmp_path / "groups.log"
    groups.write_bytes(build_batch([(encode_key(GroupKey("g")), encode_group(
        GroupValue("consumer", 1, "range", "m-1", 99, (member,))), [], 1)]))
    line = oncelog("dump-log", "--offsets-decoder", str(groups)).stdout.splitlines()[-1]
    assert line.endswith(
        'key: {"type":"2","data":{"group":"g"}} payload: {"version":"3","data":{'
        '"protocolType":"consumer","generation":1,"protocol":"range","leader":"m-1",'
        '"currentStateTimestamp":99,"members":[{"memberId":"m-1","groupInstanceId":null,'
        '"clientId":"c","clientHost":"/127.0.0.1","rebalanceTimeout":300000,'
        '"sessionTimeout":45000,"subscription":{"topics":["orders"],"userData":null,'
        '"ownedPartitions":[]},"assignment":{"assignedPartitions":[{"topic":"orders",'
        '"partitions":[0]}],"userData":null}}]}}'), line
    state = tmp_path / "txn.log"
    meta = TransactionMetadata("my-txn", 17, 2, 60_000)
    state.write_bytes(build_batch([
        (txn_format.encode_key("my-txn"), txn_format.encode_value(meta), [], 1)]))
    out = oncelog("dump-log", "--transaction-log-decoder", str(state)).stdout
    assert 'key: {"type":"0","data":{"transactionalId":"my-txn"}} payload: {"version":"0",' \
        '"data":{"producerId":17,"producerEpoch":2,"transactionTimeoutMs":60000,' \
        '"transactionStatus":0,"transactionPartitions":null,' \
        '"transactionLastUpdateTimestampMs":-1,"transactionStartTimestampMs":-1}}' in out
