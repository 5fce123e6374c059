"""Our on-disk format is Kafka's, proven by Kafka's own reader: ``kafka-dump-log --files``
(DumpLogSegments) reads a whole oncelog data directory, every ``.log``, ``.index``,
``.timeindex``, ``.txnindex`` and ``.snapshot`` file of the ordinary partitions and of
``__transaction_state`` and ``__consumer_offsets``, with ``--print-data-log``,
``--deep-iteration``, ``--transaction-log-decoder``, ``--offsets-decoder``,
``--index-sanity-check`` and ``--verify-index-only``, finds nothing wrong, and prints what was
produced. The same operations against the session's real Kafka give the same dump, except
where docs/kafka-compatibility.md ("On-disk format") says why not.

One broker process, one pass of operations: records compressed with each codec (keys,
headers), an idempotent producer, transactions committed and aborted (control batches, an
aborted-transaction index), a classic group's offset commit and a transactional one
(sendOffsetsToTransaction), small segments so that they roll (index entries, producer
snapshots written at the roll), then a clean stop.
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
import time
from collections import defaultdict
from pathlib import Path

import cramjam
import pytest
from support.apache_kafka import SHARED_DIR_ENV
from support.interop import unique_topic
from support.raw_wire import RawConnection, create_topics_request, produce
from test_batch_validation import assert_refused, good_batch, with_payload

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.harness.apache_kafka import kafka_sh
from oncelog.harness.broker_process import BrokerProcess
from oncelog.log.producer_state import BatchMetadata, ProducerStateEntry, ProducerStateManager
from oncelog.records import build_batch
from oncelog.records.batch import HEADER_SIZE
from oncelog.records.compression import Compression, _xxh32, compress

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
SETTINGS = {"transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "offsets.topic.replication.factor": "1"}
# small segments: several per partition, an index entry per batch (oncelog only: Kafka 4
# refuses a segment.bytes under 1 MiB)
PLAIN_CONFIG = {"segment.bytes": "1000", "index.interval.bytes": "100"}
TXN_CONFIG = {"segment.bytes": "300"}
TXN_OFFSET = 7  # what the transactional producer commits for the group
ROUNDS = 2  # transactions committed, and as many aborted
UNKNOWN_SERVER_ERROR = -1

# DumpLogSegments.printBatchLevel (magic 2) and its record lines
BATCH = re.compile(
    r"baseOffset: (?P<base>\d+) lastOffset: (?P<last>\d+) count: (?P<count>\d+) "
    r"baseSequence: (?P<bseq>-?\d+) lastSequence: (?P<lseq>-?\d+) "
    r"producerId: (?P<pid>-?\d+) producerEpoch: (?P<epoch>-?\d+) "
    r"partitionLeaderEpoch: (?P<ple>-?\d+) isTransactional: (?P<txn>true|false) "
    r"isControl: (?P<control>true|false) deleteHorizonMs: OptionalLong\.empty "
    r"position: (?P<pos>\d+) CreateTime: (?P<ts>\d+) size: (?P<size>\d+) magic: 2 "
    r"compresscodec: (?P<codec>\w+) crc: \d+ isvalid: true")
RECORD = re.compile(
    r"\| offset: (?P<offset>\d+) CreateTime: \d+ keySize: (?P<ksize>-?\d+) "
    r"valueSize: (?P<vsize>-?\d+) sequence: (?P<seq>-?\d+) headerKeys: \[(?P<hkeys>[^\]]*)\]"
    r"(?: key: (?P<key>.*?))?(?: payload: (?P<payload>.*))?"
    r"(?: endTxnMarker: (?P<marker>COMMIT|ABORT) coordinatorEpoch: \d+)?")
SNAPSHOT = re.compile(
    r"producerId: (?P<pid>-?\d+) producerEpoch: (?P<epoch>-?\d+) "
    r"coordinatorEpoch: (?P<coord>-?\d+) currentTxnFirstOffset: (?P<txn>\S+) "
    r"lastTimestamp: -?\d+ ?(?:firstSequence: (?P<fseq>-?\d+) lastSequence: (?P<lseq>-?\d+) "
    r"lastOffset: (?P<loff>-?\d+) offsetDelta: (?P<delta>-?\d+) timestamp: -?\d+)?")
TXN_INDEX = re.compile(r"version: 0 producerId: (\d+) firstOffset: (\d+) lastOffset: (\d+) "
                       r"lastStableOffset: (\d+)")
DECODED = re.compile(r"\| offset: (\d+) .* key: (\{.*\}) payload: (\{.*\}|null)")
KINDS = (".log", ".index", ".timeindex", ".txnindex", ".snapshot")
PROBLEMS = ("orrupt", "Mismatches in", "mismatch", "not found in", "xception", "failed",
            "Error", "skipping")


def run_operations(bootstrap: str, plain: str, txn: str, group: str, tx_ids: tuple[str, str],
                   plain_config: dict[str, str], txn_config: dict[str, str]) -> int:
    """The pass of operations; returns the offset the group committed (its position)."""
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(plain, num_partitions=1, replication_factor=1,
                                      config=plain_config),
                             NewTopic(txn, num_partitions=1, replication_factor=1,
                                      config=txn_config)])
    for codec in CODECS:  # a batch of three records per codec, with keys and headers
        with Producer(bootstrap_servers=bootstrap, compression_type=codec,
                      enable_idempotence=False, acks=1, linger_ms=1000) as p:
            for i in range(3):
                p.send(plain, (codec + str(i)).encode() * 5, key=b"k%d" % i, partition=0,
                       headers=[("h", b"x"), ("codec", codec.encode())])
            p.flush()
    with Producer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=1000) as p:
        for j in range(4):  # four idempotent batches: sequences 0, 3, 6, 9
            for i in range(3):
                p.send(plain, b"idem%d-%d" % (j, i), partition=0)
            p.flush()
    with Producer(bootstrap_servers=bootstrap, transactional_id=tx_ids[0]) as p:
        p.init_transactions()
        for j in range(ROUNDS):
            p.begin_transaction()
            p.send(txn, b"c%d" % j, key=b"k", partition=0)
            p.commit_transaction()
            p.begin_transaction()
            p.send(txn, b"a%d" % j, partition=0)
            p.abort_transaction()
    with Consumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False) as c:
        c.subscribe([plain])
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < 5 and time.monotonic() < deadline:
            got += c.poll(1.0)
        assert len(got) >= 5
        c.commit()
        committed = c.committed([TopicPartition(plain, 0)])[TopicPartition(plain, 0)]
        assert committed is not None
        with Producer(bootstrap_servers=bootstrap, transactional_id=tx_ids[1]) as p:
            p.init_transactions()
            p.begin_transaction()
            p.send(txn, b"copied", partition=0)
            p.flush()  # the partition joins the transaction first, then the group's offsets
            p.send_offsets_to_transaction({TopicPartition(plain, 0): TXN_OFFSET},
                                          c.group_metadata())
            p.commit_transaction()
    with Admin(bootstrap_servers=bootstrap) as admin:  # until both transactions completed
        deadline = time.monotonic() + 60
        while True:
            states = {d.state for d in admin.describe_transactions(list(tx_ids)).values()}
            if states <= {"CompleteCommit", "CompleteAbort"}:
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.05)
    return committed


def sections(stdout: str) -> dict[str, list[str]]:
    """kafka-dump-log's output, file by file ("Dumping <file>" starts each)."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("Dumping "):
            current = out.setdefault(line[len("Dumping "):], [])
        else:
            current.append(line)
    return out


def unexpected_stderr(stderr: str) -> list[str]:
    """The tool's complaints, less one of its own: every segment after the first is reported
    as "Non-consecutive offsets ... -1 is followed by <its base offset>" (its check starts
    from -1 for each file; it says the same of Kafka's own segments)."""
    lines = stderr.splitlines()
    left = []
    i = 0
    while i < len(lines):
        m = re.fullmatch(r"Non-consecutive offsets in (\S+)", lines[i])
        if m and i + 1 < len(lines) and \
                lines[i + 1].strip() == f"-1 is followed by {int(Path(m[1]).stem)}":
            i += 2
            continue
        if lines[i].strip():
            left.append(lines[i])
        i += 1
    return left


def batches_of(lines: list[str]) -> list[dict]:
    """The batches of a .log section, each with its records (``records``)."""
    out: list[dict] = []
    for line in lines:
        if line.startswith("baseOffset"):
            m = BATCH.fullmatch(line)
            assert m, line
            out.append({**m.groupdict(), "records": []})
        elif line.startswith("| "):
            m = RECORD.fullmatch(line)
            assert m, line
            out[-1]["records"].append(m.groupdict())
    return out


def partition_files(data: Path, name: str, kind: str) -> list[str]:
    return sorted(str(p) for p in (data / name).glob(f"*{kind}"))


def coordinator_partition(key: str, partitions: int = 50) -> int:
    """Kafka's partition of a group or transactional id: Utils.abs(String.hashCode) modulo
    the partition count (50: offsets.topic.num.partitions and
    transaction.state.log.num.partitions by default)."""
    h = 0
    for unit in struct.unpack(f">{len(key.encode('utf-16-be')) // 2}H", key.encode("utf-16-be")):
        h = (31 * h + unit) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@pytest.fixture(scope="module")
def operated(tmp_path_factory, apache_kafka):
    """The pass against an oncelog broker (then stopped cleanly) and, side by side, against
    the session's Kafka (with names of its own)."""
    uid = unique_topic("dump")
    names = {"plain": f"{uid}-plain", "txn": f"{uid}-txn", "group": f"{uid}-g",
             "tx_ids": (f"{uid}-tx", f"{uid}-txo")}
    theirs: dict = {}

    def on_kafka() -> None:
        try:
            theirs["committed"] = run_operations(
                apache_kafka, names["plain"], names["txn"], names["group"], names["tx_ids"],
                {"index.interval.bytes": "100"}, {})
        except BaseException as exc:  # noqa: BLE001 (raised in the test's thread below)
            theirs["error"] = exc

    beside = threading.Thread(target=on_kafka, daemon=True)
    beside.start()
    data = tmp_path_factory.mktemp("kafka-dump-log") / "data"
    with BrokerProcess(data, settings=SETTINGS) as broker:
        committed = run_operations(broker.bootstrap_servers, "plain", "txn", "g-dump",
                                   ("tx-dump", "tx-offsets"), PLAIN_CONFIG, TXN_CONFIG)
        assert broker.stop() == 0
    beside.join(300)
    assert not beside.is_alive(), "the pass against Kafka did not end"
    if "error" in theirs:
        raise theirs["error"]
    return {"data": data, "committed": committed, "kafka": {**theirs, "names": names}}


@pytest.fixture(scope="module")
def ours(operated, kafka_tools):
    """The broker's data directory after the pass, and every dump of it."""
    data = operated["data"]
    files = sorted(str(p) for p in data.rglob("*") if p.is_file() and p.suffix in KINDS)
    internal = {"txn": partition_files(data, "__transaction_state-0", ".log"),
                "offsets": partition_files(data, "__consumer_offsets-0", ".log")}

    def dump(*flags: str, over: list[str] = files):
        return kafka_tools.run("kafka-dump-log", "--files", ",".join(over), *flags)

    return {
        "data": data, "files": files, "committed": operated["committed"],
        "deep": dump("--print-data-log", "--deep-iteration"),
        "txn_log": dump("--transaction-log-decoder", over=internal["txn"]),
        "offsets_log": dump("--offsets-decoder", over=internal["offsets"]),
        "sanity": dump("--index-sanity-check"),
        "verify": dump("--verify-index-only"),
    }


def test_kafkas_reader_takes_every_file_of_the_data_directory(ours):
    names = {(Path(f).parent.name, Path(f).suffix) for f in ours["files"]}
    for kind in KINDS:
        assert ("plain-0", kind) in names or kind == ".txnindex"
        assert ("txn-0", kind) in names
    for internal in ("__transaction_state-0", "__consumer_offsets-0"):
        assert {(internal, k) for k in (".log", ".index", ".timeindex", ".snapshot")} <= names
    # segments rolled: several of each ordinary partition
    assert len(partition_files(ours["data"], "plain-0", ".log")) >= 2
    assert len(partition_files(ours["data"], "txn-0", ".log")) >= 2
    for run in ("deep", "txn_log", "offsets_log", "sanity", "verify"):
        result = ours[run]
        assert result.returncode == 0, (run, result.stderr)
        assert unexpected_stderr(result.stderr) == [], (run, result.stderr)
        for problem in PROBLEMS:
            assert problem not in result.stdout, (run, problem)
    dumped = sections(ours["deep"].stdout)
    assert sorted(dumped) == ours["files"]
    # the producer snapshots all parse ("Snapshot failed schema validation" otherwise)
    for f in ours["files"]:
        if f.endswith(".snapshot"):
            assert all(SNAPSHOT.fullmatch(line) for line in dumped[f] if line), dumped[f]


def test_batches_and_records_are_what_was_produced(ours):
    dumped = sections(ours["deep"].stdout)
    plain = [b for f in partition_files(ours["data"], "plain-0", ".log")
             for b in batches_of(dumped[f])]
    assert [b["codec"] for b in plain[:5]] == ["none", "gzip", "snappy", "lz4", "zstd"]
    for n, (codec, batch) in enumerate(zip(CODECS, plain[:5])):
        assert (batch["base"], batch["last"], batch["count"]) == (str(3 * n), str(3 * n + 2),
                                                                  "3")
        assert (batch["pid"], batch["epoch"], batch["bseq"], batch["txn"], batch["control"]) \
            == ("-1", "-1", "-1", "false", "false")
        assert [(r["offset"], r["key"], r["payload"], r["hkeys"], r["seq"])
                for r in batch["records"]] == [
            (str(3 * n + i), f"k{i}", (codec + str(i)) * 5, "h,codec", "-1") for i in range(3)]
    idempotent = plain[5:]
    assert len(idempotent) == 4 and len({b["pid"] for b in idempotent}) == 1
    assert idempotent[0]["pid"] != "-1"
    assert [(b["bseq"], b["lseq"], b["epoch"], b["txn"], b["codec"]) for b in idempotent] == [
        (str(3 * j), str(3 * j + 2), "0", "false", "none") for j in range(4)]
    assert [[(r["seq"], r["payload"], r["key"]) for r in b["records"]] for b in idempotent] \
        == [[(str(3 * j + i), f"idem{j}-{i}", None) for i in range(3)] for j in range(4)]
    # offsets run on, batch after batch, segment after segment
    assert [int(b["base"]) for b in plain] == [3 * i for i in range(9)]

    txn = [b for f in partition_files(ours["data"], "txn-0", ".log")
           for b in batches_of(dumped[f])]
    assert [int(b["base"]) for b in txn] == list(range(len(txn)))
    shape = [("marker", b["records"][0]["marker"]) if b["control"] == "true"
             else ("data", b["records"][0]["payload"]) for b in txn]
    assert shape == [e for j in range(ROUNDS) for e in (
        ("data", f"c{j}"), ("marker", "COMMIT"), ("data", f"a{j}"), ("marker", "ABORT"))] + [
        ("data", "copied"), ("marker", "COMMIT")]
    assert all(b["txn"] == "true" for b in txn)
    first, second = txn[0]["pid"], txn[-1]["pid"]
    assert first != second and {b["pid"] for b in txn} == {first, second}
    # transaction version 2 (KIP-890): each marker carries the epoch bumped by the end of the
    # transaction, and the next transaction's sequences start again at 0 under it
    epochs = [(b["control"], int(b["epoch"]), b["bseq"]) for b in txn[:4 * ROUNDS]]
    assert epochs == [e for j in range(2 * ROUNDS)
                      for e in (("false", j, "0"), ("true", j + 1, "-1"))]
    for b in txn:
        if b["control"] == "true":
            assert b["records"][0]["ksize"] == "4" and b["records"][0]["vsize"] == "6"


def test_indexes_pass_kafkas_checks_and_name_the_batches_they_point_at(ours):
    sanity = sections(ours["sanity"].stdout)
    indexes = [f for f in ours["files"] if f.endswith((".index", ".timeindex"))]
    for f in indexes:
        assert sanity[f] == [f"{f} passed sanity check."], sanity[f]
    verified = sections(ours["verify"].stdout)
    assert all(verified[f] == [] for f in indexes)
    dumped = sections(ours["deep"].stdout)
    entries = 0
    for f in indexes:
        log = [b for b in batches_of(dumped[str(Path(f).with_suffix(".log"))])]
        at = {int(b["pos"]): int(b["last"]) for b in log}
        last_offsets = {int(b["last"]): i for i, b in enumerate(log)}
        for line in dumped[f]:
            if f.endswith(".index"):
                offset, position = map(int, re.fullmatch(r"offset: (\d+) position: (\d+)",
                                                          line).groups())
                # Kafka's entry: the last offset of the batch at the position
                assert at[position] == offset, (f, line)
            else:
                ts, offset = map(int, re.fullmatch(r"timestamp: (\d+) offset: (\d+)",
                                                   line).groups())
                upto = log[:last_offsets[offset] + 1]  # the greatest timestamp so far
                assert ts == max(int(b["ts"]) for b in upto), (f, line)
            entries += 1
    plain_index = dumped[partition_files(ours["data"], "plain-0", ".index")[0]]
    assert len(plain_index) >= 2  # an entry per index.interval.bytes
    assert entries > len(indexes)


def test_the_aborted_transaction_index_lists_the_aborted_transactions(ours):
    dumped = sections(ours["deep"].stdout)
    listed = []
    for f in partition_files(ours["data"], "txn-0", ".txnindex"):
        for line in dumped[f]:
            m = TXN_INDEX.fullmatch(line)
            assert m, line
            listed.append((Path(f).stem, *map(int, m.groups())))
    aborts = []
    for f in partition_files(ours["data"], "txn-0", ".log"):
        log = batches_of(dumped[f])
        for i, b in enumerate(log):
            if b["control"] == "true" and b["records"][0]["marker"] == "ABORT":
                data = log[i - 1]  # the transaction's one batch, just before its marker
                assert data["pid"] == b["pid"] and data["control"] == "false"
                # in the index of the marker's segment; the last stable offset after it
                aborts.append((Path(f).stem, int(b["pid"]), int(data["base"]),
                               int(b["base"]), int(b["base"]) + 1))
    assert len(aborts) == ROUNDS and listed == aborts


def test_producer_snapshots_hold_each_producers_state(ours):
    dumped = sections(ours["deep"].stdout)
    checked = 0
    for name in ("plain-0", "txn-0", "__consumer_offsets-0", "__transaction_state-0"):
        batches = [b for f in partition_files(ours["data"], name, ".log")
                   for b in batches_of(dumped[f])]
        for snap in partition_files(ours["data"], name, ".snapshot"):
            upto = int(Path(snap).stem)  # the state up to this offset
            seen = [b for b in batches if int(b["last"]) < upto and b["pid"] != "-1"]
            expected: dict[str, dict] = {}
            for b in seen:
                e = expected.setdefault(b["pid"], {"epoch": b["epoch"], "last": None,
                                                   "open": None})
                if b["epoch"] != e["epoch"]:  # a new epoch: the batches before it are gone
                    e.update(epoch=b["epoch"], last=None)
                if b["control"] == "true":
                    e["open"] = None  # its marker closes the producer's transaction
                elif b["txn"] == "true" and e["open"] is None:
                    e["open"] = b["base"]
                if b["bseq"] != "-1":
                    e["last"] = (b["bseq"], b["lseq"], b["last"])
            entries = [SNAPSHOT.fullmatch(line) for line in dumped[snap] if line]
            # Kafka's reader keeps a producer's last entry (oncelog writes one per retained
            # batch: see docs/kafka-compatibility.md)
            state = {m["pid"]: m for m in entries if m}
            assert set(state) == set(expected), (snap, dumped[snap])
            for pid, e in expected.items():
                m = state[pid]
                assert m["epoch"] == e["epoch"]
                assert m["txn"] == ("OptionalLong.empty" if e["open"] is None
                                    else f"OptionalLong[{e['open']}]")
                assert (None if m["fseq"] is None else (m["fseq"], m["lseq"], m["loff"])) \
                    == e["last"], (snap, dumped[snap])
            checked += len(expected)
    assert checked >= 5


def test_the_transaction_log_decoder_reads_the_coordinators_records(ours):
    records = [DECODED.fullmatch(line) for line in ours["txn_log"].stdout.splitlines()
               if line.startswith("| ")]
    assert records and all(records)
    keys = [json.loads(m[2]) for m in records if m]
    values = [json.loads(m[3]) for m in records if m]
    assert {k["data"]["transactionalId"] for k in keys} == {"tx-dump", "tx-offsets"}
    by_id = defaultdict(list)
    for k, v in zip(keys, values):
        assert k["type"] == "0" and v["version"] == "1"
        by_id[k["data"]["transactionalId"]].append(v["data"])
    dump = by_id["tx-dump"]
    # Empty, then three times Ongoing PrepareCommit CompleteCommit Ongoing PrepareAbort
    # CompleteAbort (TransactionState ids 0 to 5)
    assert [v["transactionStatus"] for v in dump] == [0] + [1, 2, 4, 1, 3, 5] * ROUNDS
    assert dump[0]["transactionPartitions"] is None  # Empty: a null array, as Kafka writes
    for v in dump[1:]:
        expected = [] if v["transactionStatus"] in (4, 5) else \
            [{"topic": "txn", "partitionIds": [0]}]
        assert v["transactionPartitions"] == expected
        assert v["clientTransactionVersion"] == 2 and v["transactionTimeoutMs"] == 60000
    # the epoch is bumped at each PrepareCommit/PrepareAbort (transaction version 2)
    assert [v["producerEpoch"] for v in dump] == [0] + [e for j in range(ROUNDS) for e in (
        2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 2, 2 * j + 2)]
    offsets = by_id["tx-offsets"]
    assert [v["transactionStatus"] for v in offsets] == [0, 1, 1, 2, 4]
    assert [[p["topic"] for p in v["transactionPartitions"] or []] for v in offsets] == [
        [], ["txn"], ["__consumer_offsets", "txn"], ["__consumer_offsets", "txn"], []]


def test_the_offsets_decoder_reads_the_group_coordinators_records(ours):
    records = [DECODED.fullmatch(line) for line in ours["offsets_log"].stdout.splitlines()
               if line.startswith("| ") and "endTxnMarker" not in line]
    assert records and all(records)
    decoded = [(json.loads(m[2]), json.loads(m[3])) for m in records if m]
    kinds = [(k["type"], v["data"].get("generation", v["data"].get("offset")))
             for k, v in decoded]
    assert kinds == [("2", 1), ("1", ours["committed"]), ("1", TXN_OFFSET), ("2", 2)]
    (joined, group_value), (commit, value), (txn_key, txn_value), _left = decoded
    assert joined["data"] == {"group": "g-dump"}
    group = group_value["data"]
    assert (group["protocolType"], group["protocol"]) == ("consumer", "range")
    (member,) = group["members"]
    assert member["memberId"] == group["leader"]
    assert member["subscription"]["topics"] == ["plain"]
    assert member["assignment"]["assignedPartitions"] == [{"topic": "plain", "partitions": [0]}]
    assert commit["data"] == {"group": "g-dump", "topic": "plain", "partition": 0}
    assert txn_key["data"] == commit["data"]
    assert value["data"]["metadata"] == "" and value["data"]["leaderEpoch"] == -1
    assert txn_value["data"]["offset"] == TXN_OFFSET
    assert decoded[3][1]["data"]["members"] == [] and decoded[3][1]["data"]["leader"] is None
    # the transactional commit is in a transactional batch its COMMIT marker closes
    log = batches_of(sections(ours["offsets_log"].stdout)[
        partition_files(ours["data"], "__consumer_offsets-0", ".log")[0]])
    assert [(b["txn"], b["control"]) for b in log] == [
        ("false", "false"), ("false", "false"), ("true", "false"), ("true", "true"),
        ("false", "false")]
    assert log[3]["records"][0]["marker"] == "COMMIT"


def test_kafka_dump_log_by_its_name_in_a_jvm_of_its_own(ours, kafka_tools):
    seg = partition_files(ours["data"], "txn-0", ".log")[0]
    files = ",".join([seg, str(Path(seg).with_suffix(".txnindex")),
                      str(Path(seg).with_suffix(".index"))])
    alone = kafka_sh("kafka-dump-log", "--files", files, "--print-data-log")
    assert alone.returncode == 0, alone.stderr
    shared = kafka_tools.run("kafka-dump-log", "--files", files, "--print-data-log").check()
    assert alone.stdout.decode() == shared.stdout
    assert "endTxnMarker: ABORT" in shared.stdout and "firstOffset:" in shared.stdout


# -- beside the real Kafka -----------------------------------------------------------------------

def _normal(lines: list[str], pids: dict[str, str]) -> list[str]:
    """A dump's lines without what differs between two brokers by nature: times, CRCs,
    positions, sizes, producer ids (numbered by first appearance)."""
    out = []
    for line in lines:
        line = re.sub(r"CreateTime: \d+", "CreateTime: T", line)
        line = re.sub(r" crc: \d+", "", line)
        line = re.sub(r" position: \d+", "", line)
        line = re.sub(r" size: \d+", "", line)
        line = re.sub(r"producerId: (\d+)",
                      lambda m: f"producerId: P{pids.setdefault(m[1], str(len(pids)))}", line)
        out.append(line)
    return out


@pytest.fixture(scope="module")
def kafkas(operated, kafka_tools):
    """The dumps of the session's Kafka's files after the same pass."""
    names, committed = operated["kafka"]["names"], operated["kafka"]["committed"]
    data = Path(os.environ[SHARED_DIR_ENV]) / "kafka" / "node1" / "data"

    def logs(partition: str) -> list[str]:
        return partition_files(data, partition, ".log")

    txn_state = [f for tid in names["tx_ids"]
                 for f in logs(f"__transaction_state-{coordinator_partition(tid)}")]
    return {
        "names": names, "committed": committed,
        "deep": kafka_tools.run("kafka-dump-log", "--deep-iteration", "--print-data-log",
                                "--files", ",".join(logs(f"{names['plain']}-0")
                                                    + logs(f"{names['txn']}-0"))).check(),
        "txn_log": kafka_tools.run("kafka-dump-log", "--transaction-log-decoder", "--files",
                                   ",".join(sorted(set(txn_state)))).check(),
        "offsets_log": kafka_tools.run(
            "kafka-dump-log", "--offsets-decoder", "--files",
            ",".join(logs(f"__consumer_offsets-{coordinator_partition(names['group'])}"))
        ).check(),
    }


def _records_by_partition(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for f, lines in sections(stdout).items():
        if f.endswith(".log"):
            partition = Path(f).parent.name.rsplit("-", 2)[-2]  # plain or txn
            out[partition] += [line for line in lines if not line.startswith("Log starting")]
    return out


def test_the_data_partitions_dump_as_kafkas_do(ours, kafkas):
    mine = _records_by_partition(ours["deep"].stdout)
    theirs = _records_by_partition(kafkas["deep"].stdout)
    for partition in ("plain", "txn"):
        assert _normal(mine[partition], {}) == _normal(theirs[partition], {}), partition


def _txn_values(stdout: str, tx_ids: tuple[str, str]) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        m = DECODED.fullmatch(line)
        if not m:
            continue
        tid = json.loads(m[2])["data"]["transactionalId"]
        if tid not in tx_ids:
            continue
        v = json.loads(m[3])
        d = v["data"]
        for field in ("transactionLastUpdateTimestampMs", "transactionStartTimestampMs"):
            d[field] = "T" if d[field] > 0 else d[field]
        if d["transactionPartitions"]:
            d["transactionPartitions"] = sorted(
                ({"topic": "txn" if p["topic"].endswith("-txn") else p["topic"],
                  # the group's partition of __consumer_offsets: 0 of 1 here, of 50 in Kafka
                  "partitionIds": ["G"] if p["topic"] == "__consumer_offsets"
                  else p["partitionIds"]} for p in d["transactionPartitions"]),
                key=lambda p: p["topic"])
        out.append({"id": tx_ids.index(tid), "version": v["version"], **d})
    # one transactional id after the other (Kafka's may be in two partitions), the producer
    # ids numbered by first appearance
    out.sort(key=lambda v: v["id"])
    pids: dict[int, int] = {}
    for v in out:
        for field in ("producerId", "previousProducerId"):
            if field in v:
                v[field] = pids.setdefault(v[field], len(pids))
    return out


def test_the_transaction_log_decodes_as_kafkas_does(ours, kafkas):
    mine = _txn_values(ours["txn_log"].stdout, ("tx-dump", "tx-offsets"))
    theirs = _txn_values(kafkas["txn_log"].stdout, kafkas["names"]["tx_ids"])
    assert len(mine) == len(theirs) == 1 + 6 * ROUNDS + 5
    for a, b in zip(mine, theirs, strict=True):
        # documented in docs/kafka-compatibility.md, "On-disk format": Kafka names the
        # producer id as its own previous one from the first record on
        if "previousProducerId" not in a:
            assert b["previousProducerId"] == b["producerId"]
            a["previousProducerId"] = b["previousProducerId"]
        assert a == b


def _offsets_records(stdout: str, group: str) -> list[tuple[str, dict]]:
    out = []
    for line in stdout.splitlines():
        m = DECODED.fullmatch(line)
        if not m or m[3] == "null" or json.loads(m[2])["data"].get("group") != group:
            continue
        key, value = json.loads(m[2]), json.loads(m[3])
        d = value["data"]
        for field in ("commitTimestamp", "currentStateTimestamp"):
            d.pop(field, None)
        d.pop("topicId", None)  # OffsetCommitValue v4 (see below)
        for member in d.get("members", []):
            for field in ("memberId", "clientHost", "clientId"):
                member.pop(field)
            member["subscription"]["topics"] = ["T" for _ in member["subscription"]["topics"]]
            for p in member["assignment"]["assignedPartitions"]:
                p["topic"] = "T"
        if d.get("leader"):
            d["leader"] = "L"
        out.append((key["type"], d))
    return out


def test_the_offsets_topic_decodes_as_kafkas_does(ours, kafkas):
    mine = _offsets_records(ours["offsets_log"].stdout, "g-dump")
    theirs = _offsets_records(kafkas["offsets_log"].stdout, kafkas["names"]["group"])
    # documented in docs/kafka-compatibility.md, "On-disk format": Kafka 4's coordinator
    # writes the classic group once more when it creates it (generation 0, no members), and
    # offset commits as OffsetCommitValue v4 (v3 is the same fields without the topic id)
    assert theirs[0] == ("2", {"protocolType": "", "generation": 0, "protocol": None,
                               "leader": None, "members": []})
    theirs = theirs[1:]
    for (kind, value), committed in zip(mine[1:3], (ours["committed"], TXN_OFFSET)):
        assert kind == "1" and value["offset"] == committed
    for (kind, value), committed in zip(theirs[1:3], (kafkas["committed"], TXN_OFFSET)):
        assert kind == "1" and value["offset"] == committed
        value["offset"] = "O"
    for _kind, value in mine[1:3]:
        value["offset"] = "O"
    assert mine == theirs


# -- the writers' formats, without Kafka ---------------------------------------------------------

def test_lz4_frames_are_kafkas_independent_blocks():
    frame = compress(Compression.LZ4, b"kafka " * 40_000)  # 240 000 bytes: four blocks
    # magic, FLG (version 1, block independence), BD (64 KiB blocks), header checksum:
    # the header Kafka's Lz4BlockOutputStream writes
    assert frame[:7] == bytes.fromhex("04224d18604082")
    assert (_xxh32(b""), _xxh32(b"a"), _xxh32(bytes(range(40)))) == (
        0x02CC5D05, 0x550D7456, _reference_xxh32(bytes(range(40))))
    assert frame.endswith(b"\0\0\0\0")


def _reference_xxh32(data: bytes) -> int:
    """xxHash32 as its specification writes it, by another route (struct, four lanes)."""
    primes = (2654435761, 2246822519, 3266489917, 668265263, 374761393)
    m = 0xFFFFFFFF

    def rot(x, r):
        return ((x << r) | (x >> (32 - r))) & m

    acc = [(primes[0] + primes[1]) & m, primes[1], 0, (-primes[0]) & m]
    body = len(data) - len(data) % 16
    for off in range(0, body, 16):
        for lane, word in enumerate(struct.unpack_from("<4I", data, off)):
            acc[lane] = (rot((acc[lane] + word * primes[1]) & m, 13) * primes[0]) & m
    h = (sum(rot(a, r) for a, r in zip(acc, (1, 7, 12, 18))) + len(data)) & m
    rest = data[body:]
    for off in range(0, len(rest) - len(rest) % 4, 4):
        h = (rot((h + struct.unpack_from("<I", rest, off)[0] * primes[2]) & m, 17)
             * primes[3]) & m
    for byte in rest[len(rest) - len(rest) % 4:]:
        h = (rot((h + byte * primes[4]) & m, 11) * primes[0]) & m
    h = ((h ^ (h >> 15)) * primes[1]) & m
    h = ((h ^ (h >> 13)) * primes[2]) & m
    return h ^ (h >> 16)


def test_a_snapshot_is_kafkas_layout_and_keeps_every_retained_batch():
    mgr = ProducerStateManager()
    entry = ProducerStateEntry(7, 3, last_timestamp=500, coordinator_epoch=2)
    for i in range(3):
        entry.batches.append(BatchMetadata(2 * i, 2 * i + 1, 10 + 2 * i, 1, 100 + i))
    mgr.producers[7] = entry
    mgr.producers[9] = ProducerStateEntry(9, 0, last_timestamp=600, coordinator_epoch=1,
                                          current_txn_first_offset=42)
    data = mgr.snapshot_bytes()
    version, _crc, count = struct.unpack_from(">hIi", data)
    assert (version, count, len(data)) == (1, 4, 10 + 4 * 46)  # Kafka's ProducerSnapshot v1
    entries = list(struct.iter_unpack(">qhiqiqiq", data[10:]))
    # one per retained batch, oldest first, the last with the producer's last timestamp
    assert entries[:3] == [(7, 3, 1, 10, 1, 100, 2, -1), (7, 3, 3, 12, 1, 101, 2, -1),
                           (7, 3, 5, 14, 1, 500, 2, -1)]
    assert entries[3] == (9, 0, -1, -1, 0, 600, 1, 42)  # no batch: as Kafka writes it
    back = ProducerStateManager.from_snapshot(data)
    assert [(b.first_seq, b.last_seq, b.last_offset) for b in back.producers[7].batches] == [
        (0, 1, 10), (2, 3, 12), (4, 5, 14)]
    assert back.producers[7].last_timestamp == 500
    assert back.producers[9].current_txn_first_offset == 42
    assert not back.producers[9].batches


@pytest.fixture(scope="module")
def validating_broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("lz4") / "data") as b:
        with RawConnection(b.bootstrap_servers) as conn:
            assert conn.request(create_topics_request("lz4")).topics[0].error_code == 0
        yield b


def test_the_broker_refuses_lz4_of_linked_blocks_as_kafkas_reader_would(validating_broker):
    """A payload Kafka's reader cannot read never reaches the log: LZ4 of linked blocks
    (python-lz4's and cramjam's default) is refused with UNKNOWN_SERVER_ERROR, as Kafka 4.3
    refuses it; independent blocks, with or without checksums, are taken."""
    records = build_batch([(b"k", b"lz4 " * 50, [], int(time.time() * 1000))])[HEADER_SIZE:]

    def framed(block_linked: bool) -> bytes:
        c = cramjam.lz4.Compressor(block_linked=block_linked)
        c.compress(records)
        return bytes(c.finish())

    linked = with_payload(good_batch(), framed(True), int(Compression.LZ4))
    assert_refused(validating_broker, linked, UNKNOWN_SERVER_ERROR, topic="lz4")
    with RawConnection(validating_broker.bootstrap_servers) as conn:
        for payload in (framed(False), compress(Compression.LZ4, records)):
            taken = produce(conn, "lz4", 0, with_payload(good_batch(), payload,
                                                          int(Compression.LZ4)))
            assert taken.error_code == 0, taken


def test_an_index_of_base_offsets_from_an_older_oncelog_still_loads(tmp_path, caplog):
    """Before this format an entry named its batch's base offset: such an index is taken as it
    is (no rebuild, no recovery of the segment), new entries are Kafka's."""
    from support.logs import advance_high_watermark, open_log

    from oncelog.log import LogConfig
    from oncelog.records import split_batches

    cfg = LogConfig(index_interval_bytes=1, segment_bytes=400)
    plog = open_log(tmp_path / "t-0", cfg)
    for i in range(5):  # four batches in the first segment, which the fifth seals
        data = bytearray(build_batch([(b"k", b"v%d" % j, [], 1000 + i) for j in range(3)]))
        plog.append(data, split_batches(data), 2000)
    advance_high_watermark(plog)  # a single node's replica manager: read below
    plog.close(2000)
    index = tmp_path / "t-0" / "00000000000000000000.index"
    entries = list(struct.iter_unpack(">ii", index.read_bytes()))
    assert [rel for rel, _ in entries] == [2, 5, 8, 11]  # Kafka's: each batch's last offset
    older = b"".join(struct.pack(">ii", rel - 2, pos) for rel, pos in entries)
    index.write_bytes(older)
    with caplog.at_level("WARNING"):
        again = open_log(tmp_path / "t-0", cfg)
    assert "rebuilding" not in caplog.text and index.read_bytes() == older
    assert [int.from_bytes(again.read(o, 1 << 20)[:8], "big") for o in (0, 4, 7, 11)] == [
        0, 3, 6, 9]
    again.close(3000)
