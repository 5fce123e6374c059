"""Fetch responses honour fetch.max.bytes and each partition's max bytes as Kafka does: only
the first partition of the response that has data may go past a limit, with its first batch
(KIP-74); a later partition whose next batch does not fit returns nothing (it returned a whole
batch past the limit, and librdkafka dropped the connection and retried for ever)."""

from __future__ import annotations

import time

import pytest
from support.raw_wire import RawConnection, create_topics_request, produce

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch

TOPIC = "limits"
BATCH = 10_000  # about: one record of 10,000 bytes a batch


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("fetch-limits") / "data") as b:
        with RawConnection(b.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC, partitions=4)).topics[0] \
                .error_code == 0
            for p in (1, 2, 3):  # partition 0 stays empty
                for n in range(2):
                    assert produce(conn, TOPIC, p, build_batch(
                        [(None, bytes([n]) * BATCH, [], int(time.time() * 1000))])).error_code == 0
        yield b


def fetch(conn, max_bytes: int, partition_max_bytes: int) -> dict[int, int]:
    """Bytes returned per partition of one fetch over every partition from offset 0."""
    mod = request_module(ApiKey.FETCH, 12)
    parts = tuple(make(mod.FetchPartition, partition=p, current_leader_epoch=-1, fetch_offset=0,
                       last_fetched_epoch=-1, log_start_offset=-1,
                       partition_max_bytes=partition_max_bytes) for p in range(4))
    response = conn.request(make(
        mod.FetchRequest, cluster_id=None, replica_id=-1, max_wait=0, min_bytes=0,
        max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(make(mod.FetchTopic, topic=TOPIC, partitions=parts),),
        forgotten_topics_data=(), rack_id=""))
    return {p.partition_index: len(p.records or b"") for p in response.responses[0].partitions}


def test_only_the_first_partition_with_data_may_exceed_fetch_max_bytes(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        sizes = fetch(conn, max_bytes=BATCH + BATCH // 2, partition_max_bytes=1 << 20)
    one = sizes[1]
    assert BATCH < one < BATCH + 200  # one batch: the second does not fit
    assert sizes == {0: 0, 1: one, 2: 0, 3: 0}  # partitions 2 and 3 got nothing past it


def test_a_first_batch_larger_than_every_limit_still_comes(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        sizes = fetch(conn, max_bytes=100, partition_max_bytes=100)
    assert sizes[0] == 0 and sizes[1] > BATCH and sizes[2] == sizes[3] == 0


def test_a_later_partition_gets_what_fits_its_own_limit(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        sizes = fetch(conn, max_bytes=10 * BATCH, partition_max_bytes=BATCH + BATCH // 2)
    # each partition: one batch within its limit; the first may not take more than fits
    assert sizes[0] == 0 and all(BATCH < sizes[p] < BATCH + 200 for p in (1, 2, 3))
    with RawConnection(broker.bootstrap_servers) as conn:
        sizes = fetch(conn, max_bytes=10 * BATCH, partition_max_bytes=BATCH // 2)
    assert sizes[1] > BATCH and sizes[2] == sizes[3] == 0  # too big for their own limit
