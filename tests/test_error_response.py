"""A handler that fails unexpectedly answers its request with UNKNOWN_SERVER_ERROR for
everything the request named, as Kafka's KafkaApis.handleError does, and the connection stays
open (it was closed)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.raw_wire import RawConnection, error_codes, list_offsets_request
from support.tiers import sample_and_sweep
from support.wire_fuzz import API_VERSIONS

from oncelog.protocol import (
    ApiKey,
    decode_response,
    encode_response,
    make,
    request_class,
    request_module,
    response_class,
)
from oncelog.protocol.error_response import error_response
from oncelog.server.embedded import EmbeddedBroker

UNKNOWN_SERVER_ERROR = -1


@pytest.mark.parametrize("examples", sample_and_sweep(len(API_VERSIONS) // 5,
                                                    len(API_VERSIONS) * 5))
def test_every_api_has_an_error_response_that_encodes(examples):
    """Every API and version (the sweep: five requests of each on average; the unit tier's
    sample: a fifth of them, others each run)."""

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        api_key, version = data.draw(st.sampled_from(API_VERSIONS))
        request = data.draw(st.from_type(request_class(api_key, version)))
        response = error_response(response_class(api_key, version), request)
        assert set(error_codes(response)) <= {UNKNOWN_SERVER_ERROR}
        _, decoded = decode_response(api_key, version, encode_response(9, response)[4:])
        assert decoded == response

    check()


def test_an_error_response_names_what_the_request_named():
    request = list_offsets_request("t", 3, -1)
    response = error_response(response_class(ApiKey.LIST_OFFSETS, 7), request)
    assert [(t.name, [(p.partition_index, int(p.error_code)) for p in t.partitions])
            for t in response.topics] == [("t", [(3, UNKNOWN_SERVER_ERROR)])]


def test_a_handler_that_fails_answers_unknown_server_error_and_keeps_the_connection(caplog):
    with EmbeddedBroker() as embedded:
        broker = embedded.server.broker

        async def broken(broker, ctx, request):
            raise RuntimeError("a bug in the ListOffsets handler")

        broker.handlers = {**broker.handlers, ApiKey.LIST_OFFSETS: broken}
        with RawConnection(embedded.bootstrap_servers) as conn:
            response = conn.request(list_offsets_request("orders", 0, -1))
            partition = response.topics[0].partitions[0]
            assert (response.topics[0].name, partition.partition_index,
                    int(partition.error_code)) == ("orders", 0, UNKNOWN_SERVER_ERROR)
            versions = conn.request(make(request_module(ApiKey.API_VERSIONS, 3)
                                         .ApiVersionsRequest, client_software_name="t",
                                         client_software_version="1"))
            assert versions.error_code == 0  # the same connection goes on
    assert "a bug in the ListOffsets handler" in caplog.text
