"""Client configuration: Kafka's names, dict or keyword form, Java defaults, clear errors."""

from __future__ import annotations

import pytest

from oncelog import Admin, Consumer, Producer
from oncelog.client.config import consumer_config, producer_config
from oncelog.records import Compression


def test_dict_of_dotted_names_and_keyword_arguments_give_the_same_config():
    from_dict = producer_config({"bootstrap.servers": "h:1,k:2", "linger.ms": "7",
                                 "compression.type": "zstd", "acks": "all",
                                 "enable.idempotence": "true", "batch.size": 1000}, {})
    from_kwargs = producer_config(None, {"bootstrap_servers": ["h:1", "k:2"], "linger_ms": 7,
                                         "compression_type": "zstd", "acks": -1,
                                         "enable_idempotence": True, "batch_size": "1000"})
    for attr in ("bootstrap_servers", "linger_ms", "compression_type", "acks",
                 "enable_idempotence", "batch_size"):
        assert getattr(from_dict, attr) == getattr(from_kwargs, attr)
    assert from_dict.bootstrap_servers == [("h", 1), ("k", 2)]
    assert from_dict.compression_type is Compression.ZSTD
    assert from_dict.linger_ms == 7


def test_keyword_arguments_override_the_dict():
    cfg = consumer_config({"bootstrap.servers": "h:1", "fetch.max.wait.ms": 100},
                          {"fetch_max_wait_ms": 5})
    assert cfg.fetch_max_wait_ms == 5


def test_defaults_are_the_java_clients():
    p = producer_config({"bootstrap.servers": "h:1"}, {})
    assert (p.acks, p.batch_size, p.linger_ms, p.retries, p.delivery_timeout_ms,
            p.request_timeout_ms, p.max_in_flight_requests_per_connection,
            p.enable_idempotence, p.compression_type, p.retry_backoff_ms) == \
        (-1, 16384, 5, 2**31 - 1, 120000, 30000, 5, True, Compression.NONE, 100)
    c = consumer_config({"bootstrap.servers": "h:1"}, {})
    assert (c.isolation_level, c.auto_offset_reset, c.fetch_max_wait_ms, c.fetch_min_bytes,
            c.fetch_max_bytes, c.max_partition_fetch_bytes, c.check_crcs) == \
        ("read_uncommitted", "latest", 500, 1, 52428800, 1048576, True)


@pytest.mark.parametrize("client", [Producer, Consumer, Admin])
def test_unknown_key_is_a_clear_value_error(client):
    with pytest.raises(ValueError, match=r"unknown .* config 'bootstrap_server'.*"
                                         r"did you mean 'bootstrap.servers'"):
        client(bootstrap_server="127.0.0.1:1")
    with pytest.raises(ValueError, match="unknown .* config 'no.such.key'"):
        client({"bootstrap.servers": "127.0.0.1:1", "no.such.key": 1})


def test_a_key_of_another_client_is_rejected():
    with pytest.raises(ValueError, match="unknown consumer config 'acks'"):
        Consumer(bootstrap_servers="127.0.0.1:1", acks="all")


@pytest.mark.parametrize("kwargs, message", [
    ({"acks": "some"}, "acks"),
    ({"compression_type": "brotli"}, "compression.type"),
    ({"linger_ms": -1}, "linger.ms"),
    ({"bootstrap_servers": "no-port"}, "bootstrap.servers"),
])
def test_invalid_values_name_the_key(kwargs, message):
    kwargs = {"bootstrap_servers": "h:1", **kwargs}
    with pytest.raises(ValueError, match=f"invalid value for producer config '{message}'"):
        producer_config(None, kwargs)


def test_bootstrap_servers_is_required():
    with pytest.raises(ValueError, match="'bootstrap.servers' is required"):
        producer_config(None, {})


def test_explicit_idempotence_conflicting_with_acks_is_an_error():
    with pytest.raises(ValueError, match="acks must be all"):
        producer_config(None, {"bootstrap_servers": "h:1", "enable_idempotence": True,
                               "acks": 1})


def test_default_idempotence_yields_to_explicit_acks():
    cfg = producer_config(None, {"bootstrap_servers": "h:1", "acks": 1})
    assert cfg.enable_idempotence is False
    assert cfg.acks == 1


def test_isolation_level_and_offset_reset_are_checked():
    with pytest.raises(ValueError, match="isolation.level"):
        consumer_config(None, {"bootstrap_servers": "h:1", "isolation_level": "committed"})
    cfg = consumer_config(None, {"bootstrap_servers": "h:1", "auto_offset_reset": "EARLIEST"})
    assert cfg.auto_offset_reset == "earliest"
