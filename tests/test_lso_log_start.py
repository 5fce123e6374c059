"""The last stable offset never lies below the log start (issue 29): DeleteRecords past the
first offset of an open transaction leaves the LSO at the new log start, as Kafka's UnifiedLog
does (it raises the first unstable offset to the log start offset). ListOffsets latest for
read_committed answers the log start; read_committed consumers from "latest" and from
"earliest" sit there without an out-of-range reset and then receive every record committed
from it on, once the transaction ends."""

from __future__ import annotations

from support.raw_wire import RawConnection, fetch_request
from support.waiting import wait_until

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.harness.broker_process import BrokerProcess

LATEST, EARLIEST = -1, -2
READ_COMMITTED = 1


def test_delete_records_past_an_open_transaction_moves_the_lso_to_the_log_start(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker:
        bootstrap = broker.bootstrap_servers
        tp = TopicPartition("lso", 0)
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic("lso", num_partitions=1)])
            with Producer(bootstrap_servers=bootstrap, transactional_id="open") as txn:
                txn.init_transactions()
                txn.begin_transaction()
                for i in range(5):
                    txn.send("lso", b"early-%d" % i, partition=0)
                txn.flush()  # offsets 0-4, in the log, uncommitted
                deleted = admin.delete_records({tp: 5})
                assert deleted[tp] == 5
                committed = admin.list_offsets({tp: LATEST}, isolation_level="read_committed")
                uncommitted = admin.list_offsets({tp: LATEST})
                earliest = admin.list_offsets({tp: EARLIEST})
                assert (committed[tp].offset, uncommitted[tp].offset, earliest[tp].offset) == \
                    (5, 5, 5)
                with RawConnection(bootstrap) as conn:
                    pd = conn.request(fetch_request("lso", 0, 5, isolation_level=READ_COMMITTED)
                                      ).responses[0].partitions[0]
                    assert (pd.error_code, pd.last_stable_offset, pd.log_start_offset) == \
                        (0, 5, 5)
                consumers = [Consumer(bootstrap_servers=bootstrap, auto_offset_reset=reset,
                                      isolation_level="read_committed")
                             for reset in ("latest", "earliest")]
                try:
                    for c in consumers:
                        c.assign([tp])
                        assert c.poll(0.5) == []
                        assert c.position(tp) == 5
                    txn.send("lso", b"late-0", partition=0)  # offset 5: same transaction
                    txn.send("lso", b"late-1", partition=0)
                    txn.commit_transaction()  # marker at 7
                    txn.begin_transaction()
                    txn.send("lso", b"next-0", partition=0)  # 8
                    txn.commit_transaction()  # marker at 9
                    for c in consumers:
                        got: list = []
                        wait_until(lambda c=c, got=got: got.extend(c.poll(0.2)) or
                                   len(got) >= 3, 30, "the committed records")
                        assert c.poll(0.3) == []
                        assert [(r.offset, r.value) for r in got] == [
                            (5, b"late-0"), (6, b"late-1"), (8, b"next-0")]
                        assert c.position(tp) == 10
                finally:
                    for c in consumers:
                        c.close()
                assert admin.list_offsets({tp: LATEST}, isolation_level="read_committed"
                                          )[tp].offset == 10
