"""``oncelog dump-log`` prints what Kafka's kafka-dump-log (DumpLogSegments) prints, with its
flags: a broker process's segments of a topic written by a transactional producer (commit and
abort markers), and of ``__transaction_state`` through ``--transaction-log-decoder`` (Kafka's
JSON of TransactionLogKey / TransactionLogValue); and ``| head -1`` ends the command quietly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from support.cli import ONCELOG, oncelog

from oncelog import Admin, NewTopic, Producer
from oncelog.harness.broker_process import BrokerProcess

TOPIC = "dumped-txn"
SETTINGS = {"transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1"}

# DumpLogSegments.printBatchLevel, magic 2
BATCH = re.compile(
    r"baseOffset: (\d+) lastOffset: (\d+) count: (\d+) baseSequence: (-?\d+) "
    r"lastSequence: (-?\d+) producerId: (-?\d+) producerEpoch: (-?\d+) "
    r"partitionLeaderEpoch: -?\d+ isTransactional: (true|false) isControl: (true|false) "
    r"deleteHorizonMs: OptionalLong\.empty position: (\d+) CreateTime: \d+ size: (\d+) "
    r"magic: 2 compresscodec: none crc: \d+ isvalid: true")
# its record lines under --print-data-log
RECORD = re.compile(
    r"\| offset: (\d+) CreateTime: \d+ keySize: (-?\d+) valueSize: (-?\d+) sequence: (-?\d+) "
    r"headerKeys: \[([^\]]*)\](?: key: (\S+))?(?: payload: (.*))?")
MARKER = re.compile(r"\| offset: (\d+) CreateTime: \d+ keySize: 4 valueSize: 6 sequence: -1 "
                    r"headerKeys: \[\] endTxnMarker: (COMMIT|ABORT) coordinatorEpoch: \d+")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A broker and its files after one committed and one aborted transaction."""
    with BrokerProcess(tmp_path_factory.mktemp("dump") / "data", settings=SETTINGS) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, num_partitions=1)])
        with Producer(bootstrap_servers=b.bootstrap_servers,
                      transactional_id="dumper") as p:
            p.init_transactions()
            p.begin_transaction()
            for i in range(3):
                p.send(TOPIC, b"v%d" % i, key=b"k%d" % i, headers=[("h", b"x")])
            p.commit_transaction()
            p.begin_transaction()
            p.send(TOPIC, b"dropped")
            p.abort_transaction()
        yield b


def test_a_transactional_segment_prints_as_kafka_prints_it(written):
    seg = written.data_dir / f"{TOPIC}-0" / "00000000000000000000.log"
    out = oncelog("dump-log", "--files", str(seg), "--print-data-log").stdout.splitlines()
    assert out[:2] == [f"Dumping {seg}", "Log starting offset: 0"]
    batches = [BATCH.fullmatch(line) for line in out if line.startswith("baseOffset")]
    assert all(batches), out
    shapes = [(m[1], m[2], m[3], m[4], m[5], m[8], m[9]) for m in batches if m]
    assert shapes == [("0", "2", "3", "0", "2", "true", "false"),    # the committed records
                      ("3", "3", "1", "-1", "-1", "true", "true"),   # COMMIT
                      # the aborted one: sequences start again at 0 under the epoch
                      # bumped at the commit (KIP-890)
                      ("4", "4", "1", "0", "0", "true", "false"),
                      ("5", "5", "1", "-1", "-1", "true", "true")]   # ABORT
    assert len({m[6] for m in batches if m}) == 1  # one producer id throughout
    positions = [int(m[10]) for m in batches if m]
    sizes = [int(m[11]) for m in batches if m]
    assert positions == [0] + [sum(sizes[:i]) for i in range(1, 4)]
    assert sum(sizes) == seg.stat().st_size
    records = [RECORD.fullmatch(line) for line in out
               if line.startswith("| ") and "endTxnMarker" not in line]
    assert all(records), out
    assert [(m[1], m[2], m[3], m[4], m[5], m[6], m[7]) for m in records if m] == [
        ("0", "2", "2", "0", "h", "k0", "v0"), ("1", "2", "2", "1", "h", "k1", "v1"),
        ("2", "2", "2", "2", "h", "k2", "v2"), ("4", "-1", "7", "0", "", None, "dropped")]
    markers = [MARKER.fullmatch(line) for line in out if "endTxnMarker" in line]
    assert [(m[1], m[2]) for m in markers if m] == [("3", "COMMIT"), ("5", "ABORT")]
    # without --print-data-log: batches only; --deep-iteration: records without data
    shallow = oncelog("dump-log", str(seg)).stdout.splitlines()
    assert not any(line.startswith("|") for line in shallow) and len(shallow) == 6
    deep = oncelog("dump-log", "--deep-iteration", "--files", str(seg)).stdout.splitlines()
    assert "| offset: 0 " in deep[3] and deep[3].endswith("headerKeys: [h]")
    assert "key:" not in "\n".join(deep) and "payload:" not in "\n".join(deep)


def test_the_transaction_log_decoder_prints_kafkas_json(written):
    seg = written.data_dir / "__transaction_state-0" / "00000000000000000000.log"
    proc = oncelog("dump-log", "--files", str(seg), "--transaction-log-decoder")
    assert "TransactionState" not in proc.stdout and "frozenset" not in proc.stdout
    pairs = [re.fullmatch(r"\| offset: \d+ .* key: (\{.*\}) payload: (\{.*\})", line)
             for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert pairs and all(pairs), proc.stdout
    keys = [json.loads(m[1]) for m in pairs if m]
    values = [json.loads(m[2]) for m in pairs if m]
    assert all(k == {"type": "0", "data": {"transactionalId": "dumper"}} for k in keys)
    for v in values:
        assert v["version"] in ("0", "1")
        assert list(v["data"])[:1] == ["producerId"]
        assert {"producerId", "producerEpoch", "transactionTimeoutMs", "transactionStatus",
                "transactionPartitions", "transactionLastUpdateTimestampMs",
                "transactionStartTimestampMs"} <= set(v["data"])
    # TransactionState ids: Empty 0, Ongoing 1, PrepareCommit 2, PrepareAbort 3,
    # CompleteCommit 4, CompleteAbort 5: the two transactions' transitions in order
    states = [v["data"]["transactionStatus"] for v in values]
    assert states == [0, 1, 2, 4, 1, 3, 5], states
    ongoing = values[1]["data"]
    assert ongoing["transactionPartitions"] == [{"topic": TOPIC, "partitionIds": [0]}]
    assert values[0]["data"]["transactionPartitions"] is None  # Empty: null, as Kafka writes
    # --skip-record-metadata: only key and payload
    bare = oncelog("dump-log", "--transaction-log-decoder", "--skip-record-metadata",
                   str(seg)).stdout.splitlines()
    assert bare[3].startswith('| key: {"type":"0"') and " payload: {" in bare[3]


def test_a_reader_that_stops_early_ends_the_command_quietly(written):
    seg = written.data_dir / f"{TOPIC}-0" / "00000000000000000000.log"
    # enough output that the pipe is closed while the command still writes
    files = ",".join([str(seg)] * 400)
    pipeline = " ".join(f"'{a}'" for a in ONCELOG) + \
        f" dump-log --print-data-log --files '{files}' | head -1"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], capture_output=True,
                          text=True, timeout=120, env={**os.environ})
    assert proc.stdout == f"Dumping {seg}\n"
    assert proc.stderr == ""
    assert proc.returncode in (0, 141), proc.returncode  # 141: 128 + SIGPIPE, as Unix tools
    assert sys.executable in ONCELOG


def test_index_files_checked_as_kafka_checks_them(written, tmp_path):
    seg = written.data_dir / f"{TOPIC}-0" / "00000000000000000000.log"
    index = seg.with_suffix(".index")
    ok = oncelog("dump-log", "--index-sanity-check", "--files", f"{index},"
                 f"{seg.with_suffix('.timeindex')}")
    assert f"{index} passed sanity check." in ok.stdout.splitlines()
    assert f"{seg.with_suffix('.timeindex')} passed sanity check." in ok.stdout.splitlines()
    verified = oncelog("dump-log", "--verify-index-only", str(index))
    assert verified.stdout.splitlines() == [f"Dumping {index}"] and verified.stderr == ""
    # an index beside the same segment (entries: the last offset of the batch at the position,
    # as Kafka's) whose second entry points at the wrong batch
    positions = [int(m[1]) for m in re.finditer(r"position: (\d+) CreateTime",
                                                oncelog("dump-log", str(seg)).stdout)]
    copy = tmp_path / seg.name
    copy.write_bytes(seg.read_bytes())
    good = copy.with_suffix(".index")
    good.write_bytes((2).to_bytes(4, "big") + (0).to_bytes(4, "big")
                     + (3).to_bytes(4, "big") + positions[1].to_bytes(4, "big"))
    assert oncelog("dump-log", "--verify-index-only", str(good)).stderr == ""
    assert oncelog("dump-log", str(good)).stdout.splitlines()[1:] == [
        "offset: 2 position: 0", f"offset: 3 position: {positions[1]}"]
    good.write_bytes((2).to_bytes(4, "big") + (0).to_bytes(4, "big")
                     + (3).to_bytes(4, "big") + positions[2].to_bytes(4, "big"))
    bad = oncelog("dump-log", "--verify-index-only", str(good), check=False)
    assert bad.returncode == 1
    assert bad.stderr.splitlines() == [f"Mismatches in :{good}",
                                       "  Index offset: 3, log offset: 4"]
    good.write_bytes((2).to_bytes(4, "big") + (0).to_bytes(4, "big")
                     + (3).to_bytes(4, "big") + (0).to_bytes(4, "big"))
    insane = oncelog("dump-log", "--index-sanity-check", str(good), check=False)
    assert insane.returncode == 1
    assert f"{good} failed sanity check: entry 1: position 0 after 0" in insane.stdout
