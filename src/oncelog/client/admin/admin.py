"""The Admin client: create, delete, list and describe topics; list, describe and abort
transactions and describe producers (KIP-664). Synchronous, caller's thread.

Each call retries network failures and NOT_CONTROLLER until default.api.timeout.ms, and raises the ``oncelog.errors`` class of the first
non-retriable per-topic error (``TopicAlreadyExistsError``, ``InvalidTopicError``,
``UnknownTopicOrPartitionError`` ...) after the whole request has been answered, so topics that
could be created are created.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from kio.schema.errors import ErrorCode

from ...errors import (
    KafkaError,
    NotControllerError,
    RetriableError,
    ThrottlingQuotaExceededError,
    error_for_code,
)
from ...protocol import ApiKey, millis
from ...security.acls import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    operations_from_bit_field,
)
from .. import coordinator_request
from ..config import admin_config
from ..coordinator_request import (
    KEY_TYPE_GROUP,
    KEY_TYPE_TRANSACTION,
    Action,
    BrokerVersions,
    CoordinatorRequestHandler,
    Coordinators,
)
from ..errors import KafkaTimeoutError
from ..metadata import BrokerNode, metadata_request
from ..network import NetworkClient
from ..types import (
    ConsumerGroupDescription,
    ConsumerGroupListing,
    ListOffsetsResultInfo,
    NewPartitions,
    NewTopic,
    ProducerState,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from . import admin_configs, admin_groups, scram_admin
from .admin_configs import AlterConfigOp, ConfigEntry, ConfigResource

_client_ids = itertools.count(1)

RESOURCE_TOPIC = 2  # DescribeConfigs resource type

# Per-topic answers worth asking again, as in the Java admin client: the controller moved, or a
# quota said "later". Every other per-topic error is the answer (UNKNOWN_TOPIC_OR_PARTITION is
# retriable for a producer waiting for a topic, but final for "delete this topic").
_RETRY_TOPIC_ERRORS = {NotControllerError.code, ThrottlingQuotaExceededError.code}

# ListGroups answers asked again (Kafka's admin client: a broker loading its groups' partitions).
_LIST_GROUPS_RETRIABLE = {int(ErrorCode.coordinator_load_in_progress),
                          int(ErrorCode.coordinator_not_available)}

# The transaction timeout of force-terminate's InitProducerId. Nothing is written under it (the
# id is left Empty until its next producer registers its own), and 1 ms is within every
# broker's transaction.max.timeout.ms (at least 1), as Kafka 3.x's FenceProducersHandler sends.
# (Kafka's current handler sends FenceProducersOptions.timeoutMs or request.timeout.ms, as its
# coordinator uses the value as the transaction log append's timeout; ours appends with a
# log-write timeout of its own, whatever the request says.)
_FENCE_TRANSACTION_TIMEOUT_MS = 1


@dataclass(frozen=True)
class ClusterDescription:
    """``Admin.describe_cluster``'s answer (Kafka's ``DescribeClusterResult``)."""

    nodes: dict[int, BrokerNode]  # node id -> the broker
    controller_id: int  # -1 when the answering broker knows of none
    cluster_id: str | None
    # KIP-430: what the caller may do on the cluster (None when not asked)
    authorized_operations: frozenset[Operation] | None = None


@dataclass(frozen=True)
class FeatureMetadata:
    """``Admin.describe_features``'s answer (Kafka's ``FeatureMetadata``): feature name ->
    (min, max) level."""

    finalized: dict[str, tuple[int, int]]
    finalized_epoch: int  # -1: none
    supported: dict[str, tuple[int, int]]


class Admin:
    """Manage topics. Configuration: bootstrap_servers=..., request_timeout_ms=...,
    default_api_timeout_ms=... (or a dict of the dotted names)."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = admin_config(config, kwargs)
        self.client_id = self.config.client_id or f"oncelog-admin-{next(_client_ids)}"
        self._net = NetworkClient(self.config, self.client_id)
        self._closed = False

    # --- topics -----------------------------------------------------------------------------

    def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None,
                      validate_only: bool = False) -> None:
        """Create topics; ``timeout_ms`` is how long the broker may take (default
        request.timeout.ms). Raises e.g. TopicAlreadyExistsError, InvalidTopicError,
        InvalidPartitionsError, InvalidReplicationFactorError, InvalidConfigError."""
        topics = list(new_topics)
        if not topics:
            return
        if timeout_ms is None:
            timeout_ms = self.config.request_timeout_ms
        values = {
            "topics": [{
                "name": t.name, "num_partitions": t.num_partitions,
                "replication_factor": t.replication_factor, "assignments": [],
                "configs": [{"name": k, "value": None if v is None else str(v)}
                            for k, v in t.config.items()],
            } for t in topics],
            "timeout": timeout_ms,
            "validate_only": validate_only,
        }
        self._per_topic(ApiKey.CREATE_TOPICS, values, "topics", "create", timeout_ms)

    def delete_topics(self, topics: Iterable[str | uuid.UUID], timeout_ms: int | None = None
                      ) -> None:
        """Delete topics, named by name or by topic id (Kafka's TopicCollection.ofTopicIds,
        DeleteTopics v6, KIP-516). Raises UnknownTopicOrPartitionError for a name no topic
        has, UnknownTopicIdError for such an id."""
        items = list(topics)
        if not items:
            return
        if timeout_ms is None:
            timeout_ms = self.config.request_timeout_ms
        names = [t for t in items if not isinstance(t, uuid.UUID)]
        ids = [t for t in items if isinstance(t, uuid.UUID)]
        if names:  # topic_names up to v5, topics from v6
            values = {"topic_names": names, "timeout": timeout_ms,
                      "topics": [{"name": n, "topic_id": None} for n in names]}
            self._per_topic(ApiKey.DELETE_TOPICS, values, "responses", "delete", timeout_ms)
        if ids:
            values = {"topics": [{"name": None, "topic_id": i} for i in ids],
                      "timeout": timeout_ms}
            self._per_topic(ApiKey.DELETE_TOPICS, values, "responses", "delete", timeout_ms)

    def create_partitions(self, new_partitions: Mapping[str, NewPartitions | int],
                          timeout_ms: int | None = None, validate_only: bool = False) -> None:
        """Kafka's Admin.createPartitions: grow each topic to its new partition count (an int,
        or NewPartitions with the added partitions' replicas). Raises e.g.
        InvalidPartitionsError (not an increase), InvalidReplicaAssignmentError,
        UnknownTopicOrPartitionError, TopicAuthorizationFailedError."""
        if not new_partitions:
            return
        if timeout_ms is None:
            timeout_ms = self.config.request_timeout_ms
        topics = []
        for name, spec in new_partitions.items():
            if isinstance(spec, int):
                spec = NewPartitions(spec)
            topics.append({"name": name, "count": spec.total_count, "assignments": None
                           if spec.new_assignments is None else
                           [{"broker_ids": list(b)} for b in spec.new_assignments]})
        values = {"topics": topics, "timeout": timeout_ms, "validate_only": validate_only}
        self._per_topic(ApiKey.CREATE_PARTITIONS, values, "results", "add partitions to",
                        timeout_ms)

    def delete_records(self, offsets: Mapping[TopicPartition | tuple[str, int], int],
                       timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """Kafka's Admin.deleteRecords (KIP-107): move each partition's log start offset to
        the given offset (-1: the high watermark), asking each partition's leader. Returns
        each partition's low watermark (its new first offset). Raises e.g.
        OffsetOutOfRangeError past the high watermark, TopicAuthorizationFailedError."""
        if timeout_ms is None:
            timeout_ms = self.config.request_timeout_ms
        wanted = {TopicPartition(*tp): int(o) for tp, o in offsets.items()}
        deadline = self._deadline(extra_ms=timeout_ms)
        out: dict[TopicPartition, int] = {}
        attempt = 0
        while wanted:
            cluster = self._metadata(sorted({tp.topic for tp in wanted}))
            by_leader: dict[int | None, list[TopicPartition]] = {}
            for tp in wanted:
                leader = cluster.leader_for(tp)
                by_leader.setdefault(leader if leader is not None and leader >= 0 else None,
                                     []).append(tp)
            retry: dict[TopicPartition, int] = {}
            for leader, tps in by_leader.items():
                topics: dict[str, list[dict[str, int]]] = {}
                for tp in tps:
                    topics.setdefault(tp.topic, []).append(
                        {"partition_index": tp.partition, "offset": wanted[tp]})
                response = self._net.request_any(ApiKey.DELETE_RECORDS, {
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                    "timeout": timeout_ms}, deadline, node_id=leader)
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition_index)
                        code = int(p.error_code)
                        if not code:
                            out[tp] = int(p.low_watermark)
                        elif issubclass(error_for_code(code), RetriableError) \
                                and code != 3:  # an unknown partition is the answer here
                            retry[tp] = wanted[tp]
                        else:
                            raise error_for_code(code)(f"cannot delete records of "
                                                       f"{tp.topic}-{tp.partition}")
            wanted = retry
            if wanted:
                attempt += 1
                if time.monotonic() >= deadline:
                    raise KafkaTimeoutError(f"cannot delete records of {sorted(wanted)}: still "
                                            "failing with retriable errors")
                self._net.sleep(self._net.retry_backoff.backoff(attempt - 1))
        return out

    def _per_topic(self, api_key: int, values: dict[str, Any], results: str, verb: str,
                   timeout_ms: int) -> None:
        """Send to the controller, retry retriable per-topic errors, raise the first other one."""
        deadline = self._deadline(extra_ms=timeout_ms)
        # A topic is named by its name, or by its id (DeleteTopics v6).
        pending: set[Any] = {(t.get("topic_id") or t["name"]) if isinstance(t, dict) else t
                             for t in values.get("topics", values.get("topic_names", []))}
        errors: list[KafkaError] = []
        attempt = 0
        while True:
            response = self._net.request_any(api_key, values, deadline,
                                             node_id=self._controller(deadline))
            retry: list[Any] = []
            for result in getattr(response, results):
                code = int(result.error_code)
                key = getattr(result, "topic_id", None)
                if key not in pending:
                    key = result.name
                if code == 0 or key not in pending:
                    pending.discard(key)
                    continue
                error = error_for_code(code)
                message = getattr(result, "error_message", None)
                if code in _RETRY_TOPIC_ERRORS:
                    retry.append(key)
                    continue
                pending.discard(key)
                errors.append(error(f"cannot {verb} topic {key!r}"
                                    + (f": {message}" if message else "")))
            if not retry:
                break
            attempt += 1
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(f"cannot {verb} topics {retry}: still failing with "
                                        "retriable errors")
            self._net.update_metadata([], deadline)  # the controller may have moved
            values = self._only(values, set(retry))
            self._net.sleep(self._net.retry_backoff.backoff(attempt - 1))
        if errors:
            raise errors[0]

    @staticmethod
    def _only(values: dict[str, Any], keys: set[Any]) -> dict[str, Any]:
        out = dict(values)
        if "topics" in values:
            out["topics"] = [t for t in values["topics"]
                             if (t.get("topic_id") or t["name"]) in keys]
        if "topic_names" in values:
            out["topic_names"] = [t for t in values["topic_names"] if t in keys]
        return out

    def _controller(self, deadline: float) -> int | None:
        """Where topic changes go: the controller (any broker forwards them in KRaft mode, but
        the controller answers without a hop)."""
        if not self._net.cluster.brokers:
            self._net.update_metadata([], deadline)
        controller = self._net.cluster.controller_id
        return controller if controller in self._net.cluster.brokers else None

    def describe_cluster(self, include_authorized_operations: bool = False
                         ) -> ClusterDescription:
        """The brokers the cluster has (registered and alive), its controller and its id, as
        Kafka's ``Admin.describeCluster`` (asked with a Metadata request naming no topic);
        with ``include_authorized_operations`` what the caller may do on the cluster too
        (KIP-430, a DescribeCluster request)."""
        cluster = self._metadata([])
        operations = None
        if include_authorized_operations:
            r = self._net.request_any(ApiKey.DESCRIBE_CLUSTER, {
                "include_cluster_authorized_operations": True, "endpoint_type": 1},
                self._deadline())
            if int(r.error_code):
                raise error_for_code(int(r.error_code))(r.error_message or "DescribeCluster")
            operations = operations_from_bit_field(int(r.cluster_authorized_operations))
        return ClusterDescription(nodes=dict(cluster.brokers), controller_id=cluster.controller_id,
                                  cluster_id=cluster.cluster_id,
                                  authorized_operations=operations)

    def describe_features(self, node_id: int | None = None) -> FeatureMetadata:
        """KIP-584's feature levels, as Kafka's ``Admin.describeFeatures``: the finalized ones
        and their epoch, and what the broker supports (an ApiVersions request, v3+)."""
        r = self._api_versions(node_id)

        def ranges(items, lo: str, hi: str) -> dict[str, tuple[int, int]]:
            return {str(f.name): (int(getattr(f, lo)), int(getattr(f, hi))) for f in items}

        return FeatureMetadata(
            finalized=ranges(getattr(r, "finalized_features", ()), "min_version_level",
                             "max_version_level"),
            finalized_epoch=int(getattr(r, "finalized_features_epoch", -1)),
            supported=ranges(getattr(r, "supported_features", ()), "min_version",
                             "max_version"))

    def api_versions(self, node_id: int) -> dict[int, tuple[int, int]]:
        """The API version ranges a broker supports (api key -> (min, max)), as
        kafka-broker-api-versions.sh shows them."""
        return {int(k.api_key): (int(k.min_version), int(k.max_version))
                for k in self._api_versions(node_id).api_keys}

    def _api_versions(self, node_id: int | None) -> Any:
        from ..connection import CLIENT_SOFTWARE_NAME, _software_version

        if node_id is not None and self._net.address(node_id) is None:
            self._metadata([])  # the brokers' addresses
        r = self._net.request_any(ApiKey.API_VERSIONS, {
            "client_software_name": CLIENT_SOFTWARE_NAME,
            "client_software_version": _software_version()}, self._deadline(), node_id=node_id)
        if int(r.error_code):
            raise error_for_code(int(r.error_code))("ApiVersions")
        return r

    def list_topics(self, include_internal: bool = False) -> list[str]:
        """Names of all topics, sorted (internal ones such as __consumer_offsets only on
        request)."""
        cluster = self._metadata(None)
        return sorted(name for name, meta in cluster.topics.items()
                      if not meta.error_code and (include_internal or not meta.is_internal))

    def describe_topics(self, topics: Iterable[str], include_authorized_operations: bool = False
                        ) -> dict[str, TopicDescription]:
        """Partitions (leader, replicas, ISR), internal flag and configs of each topic; with
        ``include_authorized_operations`` what the caller may do on each (KIP-430).

        Raises UnknownTopicOrPartitionError if one of them does not exist.
        """
        names = list(topics)
        if not names:
            return {}
        cluster = self._metadata(names)
        for name in names:
            meta = cluster.topics.get(name)
            if meta is None:
                raise error_for_code(3)(f"topic {name!r} does not exist")
            if meta.error_code:
                raise error_for_code(meta.error_code)(f"describe topic {name!r}")
        configs = self._describe_configs(names)
        operations = self._topic_operations(names) if include_authorized_operations else {}
        return {
            name: TopicDescription(
                name=name, internal=cluster.topics[name].is_internal,
                partitions=[cluster.topics[name].partitions[p]
                            for p in sorted(cluster.topics[name].partitions)],
                config=configs.get(name, {}), topic_id=cluster.topics[name].topic_id,
                authorized_operations=operations.get(name))
            for name in names
        }

    def _topic_operations(self, names: list[str]) -> dict[str, frozenset[Operation] | None]:
        """KIP-430: a Metadata request (v8+) asking for the topics' authorized operations."""
        plain = metadata_request(names, allow_auto_topic_creation=False)
        r = self._net.request_any(ApiKey.METADATA, lambda version: dict(
            plain(version), include_topic_authorized_operations=True), self._deadline())
        return {t.name: operations_from_bit_field(int(getattr(
            t, "topic_authorized_operations", -(2**31)))) for t in r.topics}

    def _describe_configs(self, names: list[str]) -> dict[str, dict[str, str | None]]:
        values = {
            "resources": [{"resource_type": RESOURCE_TOPIC, "resource_name": n,
                           "configuration_keys": None} for n in names],
            "include_synonyms": False, "include_documentation": False,
        }
        response = self._net.request_any(ApiKey.DESCRIBE_CONFIGS, values, self._deadline())
        out: dict[str, dict[str, str | None]] = {}
        for result in response.results:
            code = int(result.error_code)
            if code:
                raise error_for_code(code)(f"describe configs of topic {result.resource_name!r}"
                                           + (f": {result.error_message}"
                                              if result.error_message else ""))
            out[result.resource_name] = {c.name: c.value for c in result.configs}
        return out

    # --- configs (KIP-133, KIP-339, KIP-226; client/admin/admin_configs.py) -------------------

    def describe_configs(self, resources: Iterable[ConfigResource],
                         include_synonyms: bool = False
                         ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        """Each resource's configs with their values, sources (and synonyms on request)."""
        return admin_configs.describe_configs(self._config_call(), resources, include_synonyms)

    def alter_configs(self, configs: Mapping[ConfigResource, Mapping[str, str]],
                      validate_only: bool = False) -> None:
        """Replace each resource's overrides (topic) or dynamic configs (broker) whole."""
        admin_configs.alter_configs(self._config_call(), configs, validate_only)

    def incremental_alter_configs(self, changes: Mapping[ConfigResource, Iterable[AlterConfigOp]],
                                  validate_only: bool = False) -> None:
        """Set, delete, append to or subtract from single configs of each resource."""
        admin_configs.incremental_alter_configs(self._config_call(), changes, validate_only)

    def _config_call(self) -> admin_configs.AdminCall:
        return admin_configs.AdminCall(self._net, self._deadline(), lambda: self._metadata([]))

    # --- transactions (KIP-664) --------------------------------------------------------------

    def list_transactions(self, states: Iterable[str] | None = None,
                          producer_ids: Iterable[int] | None = None,
                          min_duration_ms: int = -1) -> list[TransactionListing]:
        """Transactional ids the coordinators hold, optionally only in these states (Kafka's
        names: Ongoing, PrepareCommit ...), of these producer ids, or open for at least
        ``min_duration_ms`` (ListTransactions v1)."""
        deadline = self._deadline()
        out: list[TransactionListing] = []
        for node in self._metadata([]).brokers:  # every broker coordinates some ids
            r = self._net.request_any(ApiKey.LIST_TRANSACTIONS, {
                "state_filters": list(states or ()), "producer_id_filters": list(producer_ids or ()),
                "duration_filter": min_duration_ms}, deadline, node_id=node)
            if int(r.error_code):
                raise error_for_code(int(r.error_code))("list transactions")
            out.extend(TransactionListing(t.transactional_id, int(t.producer_id),
                                          t.transaction_state, node)
                       for t in r.transaction_states)
        return sorted(out, key=lambda t: t.transactional_id)

    def describe_transactions(self, transactional_ids: Iterable[str]
                              ) -> dict[str, TransactionDescription]:
        """What each transactional id's coordinator holds. Raises
        TransactionalIdNotFoundError for an id it does not know."""
        deadline = self._deadline()
        return {txn_id: self._describe_transaction(txn_id, deadline)
                for txn_id in transactional_ids}

    def _describe_transaction(self, txn_id: str, deadline: float) -> TransactionDescription:
        found = Coordinators()
        r = self._to_coordinator(
            KEY_TYPE_TRANSACTION, txn_id, ApiKey.DESCRIBE_TRANSACTIONS,
            {"transactional_ids": [txn_id]}, deadline,
            lambda r: int(r.transaction_states[0].error_code), f"transactional id {txn_id!r}",
            coordinators=found)
        coordinator = found.get(KEY_TYPE_TRANSACTION, txn_id)
        (s,) = r.transaction_states
        if int(s.error_code):
            raise error_for_code(int(s.error_code))(f"transactional id {txn_id!r}")
        start = millis(s.transaction_start_time)  # None (-1): Kafka's "not open"
        return TransactionDescription(
            txn_id, s.transaction_state, int(s.producer_id), int(s.producer_epoch),
            millis(s.transaction_timeout), start if start > 0 else None,
            frozenset(TopicPartition(t.topic, int(p)) for t in s.topics for p in t.partitions),
            coordinator.node_id if coordinator is not None else -1)

    def describe_producers(self, partitions: Iterable[TopicPartition],
                           broker_id: int | None = None
                           ) -> dict[TopicPartition, list[ProducerState]]:
        """The producer state of each partition, from its leader (or from the replica on
        ``broker_id``, as Kafka's DescribeProducersOptions.brokerId): who writes there, and
        where each open transaction starts (to find a hanging one)."""
        tps = [TopicPartition(*tp) for tp in partitions]
        deadline = self._deadline()
        cluster = self._metadata(sorted({tp.topic for tp in tps}))
        out: dict[TopicPartition, list[ProducerState]] = {}
        for tp in tps:
            r = self._net.request_any(ApiKey.DESCRIBE_PRODUCERS, {"topics": [
                {"name": tp.topic, "partition_indexes": [tp.partition]}]}, deadline,
                node_id=cluster.leader_for(tp) if broker_id is None else broker_id)
            (p,) = r.topics[0].partitions
            if int(p.error_code):
                raise error_for_code(int(p.error_code))(
                    f"{tp.topic}-{tp.partition}: {p.error_message or ''}")
            out[tp] = [ProducerState(int(s.producer_id), int(s.producer_epoch),
                                     int(s.last_sequence), int(s.last_timestamp),
                                     int(s.coordinator_epoch), int(s.current_txn_start_offset))
                       for s in p.active_producers]
        return out

    def abort_transaction(self, partition: TopicPartition, producer_id: int,
                          producer_epoch: int, coordinator_epoch: int) -> None:
        """Write an ABORT marker for the producer's open transaction in ``partition`` (a
        hanging transaction the coordinator no longer knows), as Kafka's
        Admin.abortTransaction does: WriteTxnMarkers straight to the partition leader."""
        tp = TopicPartition(*partition)
        deadline = self._deadline()
        cluster = self._metadata([tp.topic])
        r = self._net.request_any(ApiKey.WRITE_TXN_MARKERS, {"markers": [{
            "producer_id": producer_id, "producer_epoch": producer_epoch,
            "transaction_result": False, "coordinator_epoch": coordinator_epoch,
            "topics": [{"name": tp.topic, "partition_indexes": [tp.partition]}]}]}, deadline,
            node_id=cluster.leader_for(tp))
        code = int(r.markers[0].topics[0].partitions[0].error_code)
        if code:
            raise error_for_code(code)(f"abort of producer {producer_id} in "
                                       f"{tp.topic}-{tp.partition}")

    def force_terminate_transaction(self, transactional_id: str,
                                    timeout: float | None = None) -> TransactionDescription:
        """Abort the transactional id's open transaction, prepared or not (KIP-939's
        forceTerminateTransaction, for a two-phase-commit participant that will not come back):
        an InitProducerId without keepPreparedTxn, as a new producer instance would send. Its
        current producer is fenced. Returns what the coordinator held before.

        Raises TransactionalIdNotFoundError for an id the coordinator does not know, instead of
        creating it. The check (DescribeTransactions) and the fence are two requests, as no
        request fences only an id that exists: an id created in between is not fenced (it did
        not exist when asked), and one that expires in between is registered again (Empty)."""
        deadline = time.monotonic() + (timeout if timeout is not None
                                       else self.config.default_api_timeout_ms / 1000)
        before = self._describe_transaction(transactional_id, deadline)
        # The coordinator aborts and answers CONCURRENT_TRANSACTIONS until it is done.
        r = self._to_coordinator(
            KEY_TYPE_TRANSACTION, transactional_id, ApiKey.INIT_PRODUCER_ID, {
            "transactional_id": transactional_id,
            "transaction_timeout": _FENCE_TRANSACTION_TIMEOUT_MS,
            "producer_id": -1, "producer_epoch": -1, "enable2_pc": False,
            "keep_prepared_txn": False}, deadline, lambda r: int(r.error_code),
            f"force-terminate of {transactional_id!r}")
        if int(r.error_code):
            raise error_for_code(int(r.error_code))(f"force-terminate of {transactional_id!r}")
        return before

    def delete_consumer_group_offsets(self, group_id: str,
                                      partitions: Iterable[TopicPartition]
                                      ) -> dict[TopicPartition, KafkaError | None]:
        """Kafka's Admin.deleteConsumerGroupOffsets (OffsetDelete, KIP-496): forget the group's
        committed offsets of these partitions. Per partition: None, or the error that kept it
        (GroupSubscribedToTopicError while a member consumes the topic,
        UnknownTopicOrPartitionError, TopicAuthorizationFailedError). Raises the group's own
        error (GroupIdNotFoundError, NonEmptyGroupError, GroupAuthorizationFailedError)."""
        wanted = list(dict.fromkeys(partitions))
        by_topic: dict[str, list[int]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        what = f"deleting offsets of group {group_id!r}"
        r = self._to_coordinator(KEY_TYPE_GROUP, group_id, ApiKey.OFFSET_DELETE, {
            "group_id": group_id, "topics": [
                {"name": t, "partitions": [{"partition_index": p} for p in ps]}
                for t, ps in by_topic.items()]}, self._deadline(),
            lambda r: int(r.error_code), what)
        if int(r.error_code):
            raise error_for_code(int(r.error_code))(what)
        out: dict[TopicPartition, KafkaError | None] = dict.fromkeys(wanted)
        for t in r.topics:
            for p in t.partitions:
                code = int(p.error_code)
                out[TopicPartition(t.name, p.partition_index)] = (
                    error_for_code(code)(f"{what}: {t.name}-{p.partition_index}")
                    if code else None)
        return out

    def list_consumer_groups(self, states: Iterable[str] | None = None,
                             types: Iterable[str] | None = None) -> list[ConsumerGroupListing]:
        """The consumer groups of every broker (ListGroups), optionally only in these states
        (KIP-518: Stable, Empty ...) or of these types (KIP-848: classic, consumer), sorted by
        group id. As Kafka's listConsumerGroups: groups of the consumer protocol (or none)."""
        deadline = self._deadline()
        out: list[ConsumerGroupListing] = []
        for node in self._metadata([]).brokers:  # every broker coordinates some groups
            attempt = 0
            while True:
                r = self._net.request_any(ApiKey.LIST_GROUPS, {
                    "states_filter": list(states or ()), "types_filter": list(types or ())},
                    deadline, node_id=node)
                code = int(r.error_code)
                # A broker still loading a partition of its groups answers a partial list
                # (COORDINATOR_LOAD_IN_PROGRESS): asked again until the deadline, as Kafka's
                # admin client retries a retriable ListGroups error.
                if code not in _LIST_GROUPS_RETRIABLE or time.monotonic() >= deadline:
                    break
                attempt += 1
                self._net.sleep(self._net.retry_backoff.backoff(attempt - 1))
            if code:
                raise error_for_code(code)("list consumer groups")
            out.extend(ConsumerGroupListing(g.group_id, not g.protocol_type, g.group_state,
                                            getattr(g, "group_type", "classic"))
                       for g in r.groups if g.protocol_type in ("consumer", ""))
        return sorted(out, key=lambda g: g.group_id)

    def describe_consumer_groups(self, group_ids: Iterable[str],
                                 include_authorized_operations: bool = False
                                 ) -> dict[str, ConsumerGroupDescription]:
        """Kafka's Admin.describeConsumerGroups (DescribeGroups): each group's state, assignor,
        coordinator and members with their assignments; with ``include_authorized_operations``
        what the caller may do on it (KIP-430). A group that does not exist is Dead with no
        members. Raises the first group's error (GroupAuthorizationFailedError ...)."""
        return admin_groups.describe_consumer_groups(
            self._net, group_ids, include_authorized_operations, self._deadline())

    def list_consumer_group_offsets(self, group_id: str,
                                    partitions: Iterable[TopicPartition] | None = None
                                    ) -> dict[TopicPartition, int | None]:
        """Kafka's Admin.listConsumerGroupOffsets (OffsetFetch): the group's committed offset
        of each partition named (None where it has none), or of every partition it committed."""
        return admin_groups.list_consumer_group_offsets(
            self._to_coordinator, group_id, None if partitions is None else list(partitions),
            self._deadline())

    def alter_consumer_group_offsets(self, group_id: str,
                                     offsets: Mapping[TopicPartition, int]) -> None:
        """Kafka's Admin.alterConsumerGroupOffsets (OffsetCommit outside the group): set the
        group's committed offset (the next offset to read) of each partition. The group must
        have no active members: one with members answers UnknownMemberIdError."""
        admin_groups.alter_consumer_group_offsets(self._to_coordinator, group_id, offsets,
                                                  self._deadline())

    def delete_consumer_groups(self, group_ids: Iterable[str]
                               ) -> dict[str, KafkaError | None]:
        """Kafka's Admin.deleteConsumerGroups (DeleteGroups): delete these groups and their
        committed offsets. Per group: None, or the error that kept it (NonEmptyGroupError
        while it has members, GroupIdNotFoundError, GroupAuthorizationFailedError)."""
        return admin_groups.delete_consumer_groups(self._to_coordinator, group_ids,
                                                   self._deadline())

    def list_offsets(self, specs: Mapping[TopicPartition, int],
                     isolation_level: str = "read_uncommitted"
                     ) -> dict[TopicPartition, ListOffsetsResultInfo]:
        """Kafka's Admin.listOffsets: per partition, the offset for its spec: -1 latest, -2
        earliest, -3 the largest timestamp's record (KIP-734), else the first record at or
        after that timestamp. ``isolation_level`` read_committed: latest is the last stable
        offset."""
        return admin_groups.list_offsets(self._net, self._metadata, specs,
                                         isolation_level == "read_committed", self._deadline())

    def _to_coordinator(self, key_type: int, key: str, api_key: ApiKey, values: dict,
                        deadline: float, error_of: Callable[[Any], int], what: str,
                        coordinators: Coordinators | None = None) -> Any:
        """Send to the coordinator of ``key`` (a transactional id or a group) and return its
        answer, retrying retriable ones (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...)
        and an unreachable node until ``deadline`` (a coordinator moves when its broker
        fails). ``coordinators``: where the coordinator found is left (who answered)."""
        # Each call finds the coordinator afresh (Kafka's admin CoordinatorStrategy): admin
        # calls are rare and independent, and a coordinator found calls ago may have moved.
        return coordinator_request.do(
            self._net, coordinators if coordinators is not None else Coordinators(),
            _CoordinatorHandler(api_key, key_type, key, values, error_of, what), deadline)

    # --- ACLs (KIP-11; CreateAcls / DescribeAcls / DeleteAcls) ---------------------------------

    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Add ACL bindings (``oncelog.security.acls.AclBinding``). Needs Alter on the
        cluster."""
        bindings = list(bindings)
        r = self._net.request_any(ApiKey.CREATE_ACLS, {"creations": [{
            "resource_type": int(b.resource_type), "resource_name": b.resource_name,
            "resource_pattern_type": int(b.pattern_type), "principal": b.principal,
            "host": b.host, "operation": int(b.operation),
            "permission_type": int(b.permission)} for b in bindings]}, self._deadline())
        for b, result in zip(bindings, r.results, strict=True):
            if int(result.error_code):
                raise error_for_code(int(result.error_code))(
                    f"{b}: {result.error_message or ''}")

    def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The bindings that match ``acl_filter`` (all of them by default)."""
        f = acl_filter or AclFilter()
        r = self._net.request_any(ApiKey.DESCRIBE_ACLS, _filter_values(f), self._deadline())
        if int(r.error_code):
            raise error_for_code(int(r.error_code))(r.error_message or "DescribeAcls")
        return [AclBinding(ResourceType(int(res.resource_type)), res.resource_name,
                           PatternType(int(res.pattern_type)), a.principal, a.host,
                           Operation(int(a.operation)), Permission(int(a.permission_type)))
                for res in r.resources for a in res.acls]

    def delete_acls(self, filters: Iterable[AclFilter]) -> list[AclBinding]:
        """Remove every binding that matches one of the filters; returns the removed ones."""
        r = self._net.request_any(ApiKey.DELETE_ACLS,
                                  {"filters": [_filter_values(f) for f in filters]},
                                  self._deadline())
        out = []
        for result in r.filter_results:
            if int(result.error_code):
                raise error_for_code(int(result.error_code))(result.error_message or
                                                             "DeleteAcls")
            out += [AclBinding(ResourceType(int(m.resource_type)), m.resource_name,
                               PatternType(int(m.pattern_type)), m.principal, m.host,
                               Operation(int(m.operation)), Permission(int(m.permission_type)))
                    for m in result.matching_acls]
        return out

    # --- SCRAM users (KIP-554) -----------------------------------------------------------------

    def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                        ) -> dict[str, list[scram_admin.ScramCredentialInfo]]:
        """Each user's SCRAM mechanisms and iterations (every user with one by default).
        Raises ResourceNotFoundError for a user named who has none. Needs Describe on the
        cluster."""
        return scram_admin.describe(self._net, None if users is None else list(users),
                                    self._deadline())

    def alter_user_scram_credentials(
            self, alterations: Iterable[scram_admin.UserScramCredentialUpsertion |
                                        scram_admin.UserScramCredentialDeletion]
    ) -> dict[str, KafkaError | None]:
        """Add, replace or delete SCRAM credentials (the password is salted and hashed here,
        never sent). Per user: None, or the error that kept its changes out
        (UnacceptableCredentialError, ResourceNotFoundError, DuplicateResourceError ...).
        Needs Alter on the cluster."""
        return scram_admin.alter(self._net, list(alterations), self._deadline())

    def _metadata(self, topics: list[str] | None):
        deadline = self._deadline()
        response = self._net.request_any(ApiKey.METADATA,
                                         metadata_request(topics, allow_auto_topic_creation=False),
                                         deadline)
        self._net.apply_metadata(response, topics)
        return self._net.cluster.with_response(response, None)

    def _deadline(self, extra_ms: int = 0) -> float:
        return time.monotonic() + (self.config.default_api_timeout_ms + extra_ms) / 1000

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections. A closed Admin cannot be used again."""
        if not self._closed:
            self._closed = True
            self._net.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _CoordinatorHandler(CoordinatorRequestHandler):
    """An admin request to the coordinator of a transactional id or a group. A retriable
    answer is asked again; at the deadline the last retriable answer is raised, as the answer
    it was (no answer at all, an unreachable coordinator: KafkaTimeoutError)."""

    def __init__(self, api: ApiKey, key_type: int, key: str, values: dict,
                 error_of: Callable[[Any], int], what: str) -> None:
        self.api, self.key_type, self.key, self.values = api, key_type, key, values
        self.error_of, self.what = error_of, what

    def create_request(self, broker: BrokerVersions) -> dict:
        return self.values

    def handle_response(self, response: Any) -> Action:
        code = self.error_of(response)
        if code and issubclass(error_for_code(code), RetriableError):
            return self.retriable(code, self.what)
        return Action.DONE

    def timeout_error(self, last: BaseException | None) -> BaseException:
        answer = self.last_error
        if answer is not None and last is answer:
            return answer
        return super().timeout_error(last)


def _filter_values(f: AclFilter) -> dict[str, Any]:
    return {"resource_type_filter": int(f.resource_type),
            "resource_name_filter": f.resource_name,
            "pattern_type_filter": int(f.pattern_type), "principal_filter": f.principal,
            "host_filter": f.host, "operation": int(f.operation),
            "permission_type": int(f.permission)}
