"""The oncelog source's options (Spark's Kafka source's) parsed without Spark: Spark's
precedence between timestamps and offsets, its refusals, our refusal of unknown options and
client settings; and the offset-range splitting of minPartitions / maxRecordsPerPartition."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("pyspark")  # oncelog.spark imports it (the options module itself does not)

from oncelog.spark.options import OptionError, parse, sink_settings
from oncelog.spark.ranges import split_ranges

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def error(options: dict, streaming: bool = False) -> str:
    with pytest.raises(OptionError) as info:
        parse({**BASE, **options}, streaming=streaming)
    return str(info.value)


# -- names ---------------------------------------------------------------------------------


def test_option_names_are_case_insensitive_as_in_spark():
    o = parse({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "SubScribe": "a, b", "STARTINGOFFSETS":
               "Earliest", "minpartitions": "4", "MaxRecordsPerPartition": "10",
               "kafka.Max.Poll.Records": "7"})
    assert (o.bootstrap_servers, o.subscribe, o.starting) == ("h:1", ["a", "b"], "earliest")
    assert (o.min_partitions, o.max_records_per_partition) == (4, 10)
    assert o.client_config()["max.poll.records"] == "7"


def test_an_unknown_option_is_refused_with_the_closest_name():
    assert error({"startingOffset": "earliest"}) == (
        "unknown option 'startingoffset' for the oncelog source (did you mean startingOffsets?)")
    assert "unknown option 'colour'" in error({"colour": "blue"})
    assert "option topic is for writing to oncelog, not for reading (to read a topic, use " \
        "subscribe)" in error({"topic": "t"})
    assert "takes no path" in error({"path": "/tmp/x"})


def test_kafka_settings_go_to_our_consumer_under_kafkas_names():
    o = parse({**BASE, "kafka.security.protocol": "SASL_PLAINTEXT",
               "kafka.sasl.mechanism": "SCRAM-SHA-256", "kafka.fetch.max.bytes": "1000",
               "kafka.group.id": "authorized-group"})
    assert o.client_config() == {
        "bootstrap.servers": "127.0.0.1:9092", "isolation.level": "read_committed",
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
        "fetch.max.bytes": "1000", "group.id": "authorized-group"}
    assert parse({**BASE, "kafka.isolation.level": "read_uncommitted"}).client_config()[
        "isolation.level"] == "read_uncommitted"


def test_unknown_or_bad_kafka_settings_are_refused_with_the_clients_message():
    assert error({"kafka.fetch.max.byte": "1"}) == (
        "option kafka.*: unknown consumer config 'fetch.max.byte' "
        "(did you mean 'fetch.max.bytes'?)")
    assert error({"kafka.linger.ms": "5"}).startswith(
        "option kafka.*: unknown consumer config 'linger.ms'")  # a producer setting
    assert "invalid value for consumer config 'isolation.level'" in error(
        {"kafka.isolation.level": "committed"})
    assert "expected host:port" in error({"kafka.bootstrap.servers": "nohost"})


def test_the_kafka_settings_spark_refuses_are_refused_with_its_reasons():
    assert error({"kafka.auto.offset.reset": "earliest"}).startswith(
        "Kafka option 'auto.offset.reset' is not supported. Instead set the source option "
        "'startingoffsets' to 'earliest' or 'latest' to specify where to start.")
    assert error({"kafka.key.deserializer": "x"}) == (
        "Kafka option 'key.deserializer' is not supported as keys are deserialized as byte "
        "arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize "
        "the keys.")
    for name in ("value.deserializer", "enable.auto.commit", "interceptor.classes"):
        assert error({f"kafka.{name}": "x"}).startswith(f"Kafka option '{name}' is not supported")


PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'username="alice" password="al\\"ice-pw";')
SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
              'username="bob" password="bob-pw";')


def test_sasl_jaas_config_logs_in_as_kafkas_client_would():
    o = parse({**BASE, "kafka.security.protocol": "SASL_PLAINTEXT",
               "kafka.sasl.jaas.config": PLAIN_JAAS})
    assert o.client_config() == {
        "bootstrap.servers": "127.0.0.1:9092", "isolation.level": "read_committed",
        "security.protocol": "SASL_PLAINTEXT", "sasl.plain.username": "alice",
        "sasl.plain.password": 'al"ice-pw'}
    _, client = sink_settings({"kafka.bootstrap.servers": "h:1",
                               "kafka.security.protocol": "sasl_plaintext",
                               "kafka.sasl.mechanism": "SCRAM-SHA-512",
                               "kafka.sasl.jaas.config": SCRAM_JAAS})
    assert (client["sasl.mechanism"], client["sasl.plain.username"],
            client["sasl.plain.password"]) == ("SCRAM-SHA-512", "bob", "bob-pw")
    assert "jaas" not in str(client)
    # A login module that is not the mechanism's, no SASL protocol, no password: refused.
    assert "names the login module 'org.apache.kafka.common.security.scram.ScramLoginModule'" \
        ", not org.apache.kafka.common.security.plain.PlainLoginModule, which " \
        "kafka.sasl.mechanism=PLAIN needs (set kafka.sasl.mechanism to SCRAM-SHA-256 or " \
        "SCRAM-SHA-512)" in error({"kafka.security.protocol": "SASL_PLAINTEXT",
                                   "kafka.sasl.jaas.config": SCRAM_JAAS})
    assert "kafka.security.protocol is PLAINTEXT: set kafka.security.protocol to " \
        "SASL_PLAINTEXT or SASL_SSL" in error({"kafka.sasl.jaas.config": PLAIN_JAAS})
    assert error({"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.jaas.config":
                  PLAIN_JAAS.replace(' password="al\\"ice-pw"', "")}) == (
        "option kafka.sasl.jaas.config has no password")
    assert "expected Kafka's JAAS syntax" in error({
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.jaas.config": PLAIN_JAAS.rstrip(";")})


def sink_error(options: dict) -> str:
    with pytest.raises(OptionError) as info:
        sink_settings({"kafka.bootstrap.servers": "127.0.0.1:9092", **options})
    return str(info.value)


def test_the_sinks_options_are_checked_before_any_task():
    # a typo in one of its options, with the closest name (Spark's sink would ignore it)
    assert sink_error({"transactionalIdPrefx": "p"}) == (
        "unknown option 'transactionalidprefx' for the oncelog sink (did you mean "
        "transactionalIdPrefix?)")
    assert sink_error({"checkpointLocaton": "/x"}).endswith("(did you mean checkpointLocation?)")
    assert sink_error({"subscribe": "t"}) == (
        "option subscribe is for reading from oncelog, not for writing (to name the topic to "
        "write, use topic)")
    # acks other than all: why, not "transactional.id conflicts" in every task
    for acks in ("1", "0"):
        message = sink_error({"kafka.acks": acks})
        assert message.startswith(f"option kafka.acks={acks} is not supported by the oncelog "
                                  "sink: it writes exactly once, in transactions, and a "
                                  "transactional producer needs acks=all (-1)")
    for acks in ("all", "-1", "ALL"):
        assert sink_settings({"kafka.bootstrap.servers": "h:1", "kafka.acks": acks})[1] == {
            "acks": acks}
    # Spark's Kafka sink's own refusals, with its words
    assert sink_error({"kafka.key.serializer": "x"}) == (
        "Kafka option 'key.serializer' is not supported as keys are serialized with "
        "ByteArraySerializer.")
    assert sink_error({"kafka.value.serializer": "x"}).startswith(
        "Kafka option 'value.serializer' is not supported")
    # what the sink sets itself, or cannot work with
    assert "set the option transactionalIdPrefix" in sink_error({"kafka.transactional.id": "x"})
    assert "never time out" in sink_error({"kafka.transaction.timeout.ms": "1000"})
    assert "transactions need idempotence" in sink_error({"kafka.enable.idempotence": "false"})
    assert sink_error({"kafka.retries": "0"}) == (
        "option kafka.*: transactional.id conflicts with the configuration: retries must be "
        "> 0 (the oncelog sink's producers are transactional)")
    assert sink_error({"kafka.linger.ms": "x"}) == (
        "option kafka.*: invalid value for producer config 'linger.ms': expected an integer, "
        "got 'x'")
    assert sink_error({"kafka.lingr.ms": "5"}).startswith(
        "option kafka.*: unknown producer config 'lingr.ms'")
    assert sink_error({"kafka.group.id": "g"}).startswith(
        "option kafka.*: unknown producer config 'group.id'")  # a consumer setting
    assert sink_settings_error() == "option kafka.bootstrap.servers is required"


def sink_settings_error() -> str:
    with pytest.raises(OptionError) as info:
        sink_settings({"topic": "t"})
    return str(info.value)


# -- what to read ----------------------------------------------------------------------------


def test_exactly_one_way_to_name_topics():
    msg = "give exactly one of the options subscribe, subscribePattern, assign"
    assert error({"assign": '{"t":[0]}'}) == msg
    assert error({"subscribe": ""}) == "option subscribe names no topic"
    o = parse({"kafka.bootstrap.servers": "h:1", "subscribePattern": " t.* "})
    assert o.pattern is not None and o.pattern.pattern == "t.*"
    assert parse({"kafka.bootstrap.servers": "h:1", "assign": '{"t":[1,0]}'}).assign == {
        "t": [1, 0]}


# -- where to start and end: Spark's order of preference -------------------------------------


def test_starting_timestamp_wins_over_by_timestamp_and_offsets():
    o = parse({**BASE, "startingTimestamp": "1000", "startingOffsetsByTimestamp":
               '{"t":{"0":5}}', "startingOffsets": "latest"})  # latest is never looked at
    assert (o.starting_timestamp, o.starting_by_timestamp, o.starting) == (1000, None, None)
    o = parse({**BASE, "startingOffsetsByTimestamp": '{"t":{"0":5,"1":7}}',
               "startingOffsets": "earliest"})
    assert (o.starting_by_timestamp, o.starting) == ({"t": {0: 5, 1: 7}}, None)
    o = parse({**BASE, "endingTimestamp": "2000", "endingOffsets": "latest"})
    assert (o.ending_timestamp, o.by_timestamp_end) == (2000, True)
    o = parse({**BASE, "endingOffsetsByTimestamp": '{"t":{"0":9}}'})
    assert o.ending_by_timestamp == {"t": {0: 9}}


def test_bad_positions_are_refused():
    assert "startingTimestamp: expected a timestamp in milliseconds" in error(
        {"startingTimestamp": "yesterday"})
    assert "timestamp -5 is negative" in error({"startingTimestamp": "-5"})
    assert "startingOffsetsByTimestamp: expected JSON" in error(
        {"startingOffsetsByTimestamp": "1000"})
    assert error({"startingOffsetsByTimestampStrategy": "earliest"}) == (
        "option startingOffsetsByTimestampStrategy must be error or latest, not 'earliest'")
    assert parse({**BASE, "startingOffsetsByTimestampStrategy": "LATEST"}
                 ).by_timestamp_strategy == "latest"
    assert error({"startingOffsets": "latest"}) == (
        "startingOffsets latest makes no sense for a batch query")
    assert error({"startingOffsets": '{"t":{"0":-1}}'}) == (
        "startingOffsets for t-0 can't be latest (-1) for a batch query")
    assert error({"endingOffsets": '{"t":{"0":-2}}'}) == (
        "endingOffsets for t-0 can't be earliest (-2)")
    assert error({"startingTimestamp": "5", "endingTimestamp": "4"}) == (
        "startingTimestamp 5 is after endingTimestamp 4")
    assert error({"startingOffsetsByTimestamp": '{"t":{"0":5}}',
                  "endingOffsetsByTimestamp": '{"t":{"0":4}}'}) == (
        "t-0: startingOffsetsByTimestamp 5 is after endingOffsetsByTimestamp 4")
    # a stream may start latest; it has no end
    assert parse({**BASE, "startingOffsets": "latest"}, streaming=True).starting == "latest"
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        assert error({name: "1"}, streaming=True) == f"{name} is for batch queries only"


# -- limits ------------------------------------------------------------------------------------


def test_limits_and_their_checks():
    o = parse({**BASE, "maxOffsetsPerTrigger": "100", "minOffsetsPerTrigger": "10",
               "maxTriggerDelay": "30s", "kafkaConsumer.pollTimeoutMs": "5000",
               "fetchOffset.numRetries": "5", "fetchOffset.retryIntervalMs": "0",
               "groupIdPrefix": "mine"}, streaming=True)
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (
        100, 10, 30_000)
    assert (o.poll_timeout_ms, o.fetch_offset_retries, o.fetch_offset_retry_interval_ms) == (
        5000, 5, 0)
    assert parse(BASE).max_trigger_delay_ms == 15 * 60_000  # Spark's default, 15m
    for text, ms in (("250", 250), ("250ms", 250), ("2m", 120_000), ("1h", 3_600_000),
                     ("3min", 180_000), ("1d", 86_400_000)):
        assert parse({**BASE, "maxTriggerDelay": text}).max_trigger_delay_ms == ms
    assert "maxTriggerDelay: expected a time such as 15m" in error({"maxTriggerDelay": "soon"})
    assert error({"minOffsetsPerTrigger": "11", "maxOffsetsPerTrigger": "10"}) == (
        "minOffsetsPerTrigger (11) is higher than maxOffsetsPerTrigger (10)")
    assert error({"minPartitions": "0"}) == "option minPartitions must be positive, not 0"
    assert error({"maxRecordsPerPartition": "x"}) == (
        "option maxRecordsPerPartition must be a number, not 'x'")
    assert error({"failOnDataLoss": "maybe"}) == (
        "option failOnDataLoss must be true or false, not 'maybe'")


# -- minPartitions / maxRecordsPerPartition --------------------------------------------------


def test_no_split_without_the_options_or_with_enough_partitions():
    ranges = [("t", 0, 0, 100), ("t", 1, 5, 5), ("t", 2, 0, 10)]
    assert split_ranges(ranges, None, None) == [("t", 0, 0, 100), ("t", 2, 0, 10)]
    assert split_ranges(ranges, 2, None) == [("t", 0, 0, 100), ("t", 2, 0, 10)]


def test_min_partitions_splits_large_partitions_in_proportion():
    # Spark's KafkaOffsetRangeCalculatorSuite's cases, worked by its rules
    assert split_ranges([("t", 0, 1, 5)], 3, None) == [
        ("t", 0, 1, 2), ("t", 0, 2, 3), ("t", 0, 3, 5)]
    # the small partition keeps its one task; the large one takes the rest of minPartitions
    assert split_ranges([("t", 0, 1, 5), ("t", 1, 1, 21)], 4, None) == [
        ("t", 0, 1, 5), ("t", 1, 1, 7), ("t", 1, 7, 14), ("t", 1, 14, 21)]
    assert split_ranges([("t", 0, 0, 10), ("t", 1, 0, 10)], 4, None) == [
        ("t", 0, 0, 5), ("t", 0, 5, 10), ("t", 1, 0, 5), ("t", 1, 5, 10)]
    # fewer offsets than tasks wanted: no empty range
    assert split_ranges([("t", 0, 0, 2)], 5, None) == [("t", 0, 0, 1), ("t", 0, 1, 2)]


def test_max_records_per_partition_cuts_ranges_then_min_partitions_applies():
    assert split_ranges([("t", 0, 0, 10), ("t", 1, 0, 3)], None, 4) == [
        ("t", 0, 0, 3), ("t", 0, 3, 6), ("t", 0, 6, 10), ("t", 1, 0, 3)]
    assert split_ranges([("t", 0, 0, 8)], None, 8) == [("t", 0, 0, 8)]
    got = split_ranges([("t", 0, 0, 100)], 8, 50)
    assert len(got) == 8 and got[0][2] == 0 and got[-1][3] == 100
    assert all(a[3] == b[2] for a, b in itertools.pairwise(got))
    assert max(e - s for _, _, s, e in got) <= 50
