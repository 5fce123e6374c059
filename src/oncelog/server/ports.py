"""What the request handlers (server/handlers/) may use of the broker: one small typed
Protocol per service, and ``BrokerPort``, the broker as a handler sees it.

A handler is ``async (broker: BrokerPort, ctx: RequestContext, request) -> response``
(``Handler``). ``Broker`` (server/broker.py) satisfies ``BrokerPort`` structurally; mypy checks
that where the broker dispatches a request to its handler, so a handler cannot reach for
anything the broker does not offer here, and every handler body is type-checked.

Each family of handlers declares the part of the broker it uses: ``GroupApiPort`` for
handlers/group.py, ``TxnApiPort`` for the transaction requests, and so on, each composed of
one-member Protocols (``HasMetadata``, ...); ``BrokerPort`` is all of them (a handler typed
with a family's port takes the broker, as ``Handler`` says), and produce and fetch take it whole.

Requests and responses are kio entities of the request's version (``Any``: their classes
differ by version); the services' values (replicas, partitions, coordinator cores) keep their
own classes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .context import RequestContext

if TYPE_CHECKING:
    from kio.schema.errors import ErrorCode

    from ..group.coordinator import Group, GroupCoordinator, JoinResponse, SyncResponse
    from ..group.log_format import OffsetValue
    from ..log import AppendResult
    from ..security.acls import Authorizer, Operation, ResourceType
    from ..security.credential_store import ScramCredentials
    from ..txn.coordinator import Outcome, TransactionCoordinator
    from .config import BrokerConfig
    from .context import Session
    from .fetch_sessions import FetchSession, SessionKey
    from .metadata import CreatedTopic
    from .partition import Partition as HostedPartition
    from .replication import AppendEntry, AppendError, AppendOrigin
    from .topics import Partition, Topic

TP = tuple[str, int]


class MetadataPort(Protocol):
    """The cluster's metadata: its latest view (brokers, topics, partition states) and the
    changes a request asks for (server/metadata.py)."""

    @property
    def view(self) -> Any: ...  # the latest ClusterView

    def coordinator_of(self, name: str, key: str) -> tuple[ErrorCode | None, int]: ...

    def request_topic(self, name: str, num: int, rf: int, configs: dict
                      ) -> ErrorCode | None: ...

    def request_internal_topic(self, name: str) -> ErrorCode | None: ...

    async def create_topic(self, name: str, num: int, rf: int, configs: dict,
                           assignment: dict[int, list[int]] | None, *, validate_only: bool,
                           timeout_ms: int) -> CreatedTopic: ...

    async def create_partitions(self, name: str, count: int,
                                assignment: list[list[int]] | None, *, validate_only: bool,
                                timeout_ms: int) -> None: ...

    async def delete_topic(self, name: str, timeout_ms: int) -> None: ...

    async def alter_topic_configs(self, name: str, configs: dict[str, str]) -> None: ...

    async def alter_broker_configs(self, entity: str, configs: dict[str, str]) -> None: ...


class ReplicasPort(Protocol):
    """The partitions this broker leads (server/replication.py's ReplicaManager)."""

    def leader_replica(self, topic: str, index: int, current_leader_epoch: int = -1
                       ) -> HostedPartition: ...

    def follower_fetched(self, r: HostedPartition, replica_id: int, fetch_offset: int,
                         log_start_offset: int) -> None: ...

    async def append_records(self, entries: dict[TP, AppendEntry], *, origin: AppendOrigin,
                             required_acks: int, timeout_ms: int
                             ) -> dict[TP, AppendResult | AppendError]: ...

    async def delete_records(self, topic: str, index: int, offset: int, timeout_ms: int
                             ) -> int: ...

    def end_offset_for_epoch(self, topic: str, index: int, current_leader_epoch: int,
                             epoch: int) -> tuple[int, int]: ...


class HostedPartitions(Protocol):
    """The partitions hosted here (server/topics.py's TopicManager)."""

    def partition(self, topic: str, index: int) -> Partition | None: ...


class LocalLogsPort(Protocol):
    """The topics and partition logs hosted here (server/topics.py's TopicManager)."""

    @property
    def data_dir(self) -> Path: ...

    def get(self, name: str) -> Topic | None: ...

    def partition(self, topic: str, index: int) -> Partition | None: ...

    def all_partitions(self) -> Iterable[Partition]: ...


class GroupCoordinatorPort(Protocol):
    """The group coordinator (server/group_service.py): its sans-IO core and the calls that
    write to ``__consumer_offsets``."""

    def shard(self, group_id: str) -> GroupCoordinator: ...

    def group(self, group_id: str) -> Group | None: ...

    def groups(self) -> dict[str, Group]: ...

    def not_coordinator(self, group_id: str) -> ErrorCode | None: ...

    def loading(self) -> bool: ...

    def partition_index(self, group_id: str, *, create: bool = False) -> int | None: ...

    def offsets_partition(self, group_id: str) -> Partition: ...

    async def join(self, group_id: str, member_id: str, *args: Any, **kw: Any
                   ) -> JoinResponse: ...

    async def sync(self, group_id: str, generation: int, member_id: str,
                   group_instance_id: str | None, assignments: dict[str, bytes] | None
                   ) -> SyncResponse: ...

    async def leave(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode | None, list[ErrorCode | None]]: ...

    async def delete_group(self, group_id: str) -> ErrorCode | None: ...

    async def delete_offsets(self, group_id: str, partitions: list[TP],
                             subscribed_topics: Callable[[bytes], Iterable[str]]
                             ) -> tuple[ErrorCode | None, dict[TP, ErrorCode | None]]: ...

    async def commit(self, group_id: str, generation: int, member_id: str,
                     group_instance_id: str | None, offsets: dict[TP, OffsetValue]
                     ) -> ErrorCode | None: ...

    async def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                         generation: int, member_id: str, group_instance_id: str | None,
                         offsets: dict[TP, OffsetValue], *, verification: Any = None,
                         require_verification: bool = False) -> ErrorCode | None: ...

    def complete_txn_offsets(self, partition_index: int, producer_id: int,
                             commit: bool) -> None: ...


class TxnCoordinatorPort(Protocol):
    """The transaction coordinator (server/txn_service.py): the core of a transactional id's
    partition here, and the carrying out of a core's effects."""

    def core_for(self, transactional_id: str
                 ) -> tuple[TransactionCoordinator | None, ErrorCode | None]: ...

    def all_cores(self) -> list[TransactionCoordinator]: ...

    def loading(self) -> bool: ...

    async def write(self, transactional_id: str, name: str,
                    decide: Callable[[TransactionCoordinator], Outcome]) -> Outcome: ...

    async def add_partitions(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, wanted: list[TP], *, version: int,
                             verify_only: bool = False, txn_version: int | None = None
                             ) -> dict[TP, ErrorCode | None]: ...


class TxnMarkersPort(Protocol):
    """The replica side's transaction markers (server/txn_marker_writer.py)."""

    async def write(self, partitions: Iterable[TP], *, producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int, transaction_version: int = 0
                    ) -> dict[TP, ErrorCode | None]: ...


class TxnVerifierPort(Protocol):
    """KIP-890's partition-leader side (server/txn_verification.py)."""

    def applies(self, new_client: bool) -> bool: ...

    async def check(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    partitions: list[TP], *, add: bool,
                    renew: Callable[[], None] | None = None) -> dict[TP, ErrorCode | None]: ...


class SecurityPort(Protocol):
    """SASL, the ACLs and the SCRAM users (server/security_service.py)."""

    @property
    def mechanisms(self) -> list[str]: ...

    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def credentials(self) -> ScramCredentials: ...

    def handshake(self, session: Session | None, mechanism: str, version: int
                  ) -> ErrorCode | None: ...

    async def authenticate(self, session: Session | None, token: bytes, peer: str
                           ) -> tuple[ErrorCode | None, str | None, bytes]: ...


class FetchSessionsPort(Protocol):
    """Fetch sessions (KIP-227, server/fetch_sessions.py)."""

    def begin(self, session_id: int, epoch: int,
              requested: list[tuple[SessionKey, int, int]], forgotten: list[SessionKey],
              uses_topic_ids: bool = False) -> tuple[FetchSession, bool]: ...

    def remove_topic(self, topic: str) -> None: ...


class ProducerIdsPort(Protocol):
    def next_producer_id(self) -> int: ...


class StatsPort(Protocol):
    """The broker's traffic counters (server/broker_stats.py)."""

    def produced(self, appended: dict, records_of: dict) -> None: ...

    def fetched(self, topic: str | None, size: int, replica_id: int) -> None: ...


# -- the broker as the handlers see it: one member a Protocol, composed per handler family ----

class HasNodeId(Protocol):
    @property
    def node_id(self) -> int: ...


class HasClusterId(Protocol):
    @property
    def cluster_id(self) -> str: ...


class HasTransactionVersion(Protocol):
    @property
    def transaction_version(self) -> int: ...


class HasConfig(Protocol):
    @property
    def config(self) -> BrokerConfig: ...


class HasMetadata(Protocol):
    @property
    def metadata(self) -> MetadataPort: ...


class HasReplication(Protocol):
    @property
    def replication(self) -> ReplicasPort: ...


class HasTopics(Protocol):
    @property
    def topics(self) -> LocalLogsPort: ...


class HasGroupCoordinator(Protocol):
    @property
    def group_coordinator(self) -> GroupCoordinatorPort: ...


class HasTxnCoordinator(Protocol):
    @property
    def txn_coordinator(self) -> TxnCoordinatorPort: ...


class HasTxnMarkers(Protocol):
    @property
    def txn_markers(self) -> TxnMarkersPort: ...


class HasTxnVerifier(Protocol):
    @property
    def txn_verifier(self) -> TxnVerifierPort: ...


class HasSecurity(Protocol):
    @property
    def security(self) -> SecurityPort: ...


class HasProducerIds(Protocol):
    @property
    def producer_ids(self) -> ProducerIdsPort: ...


class HasFetchSessions(Protocol):
    @property
    def fetch_sessions(self) -> FetchSessionsPort: ...


class HasStats(Protocol):
    @property
    def stats(self) -> StatsPort: ...


class Authorizing(Protocol):
    """The ACLs, asked for the request's principal (server/handlers/acl.py)."""

    def allowed(self, ctx: RequestContext, operation: Operation, resource_type: ResourceType,
                name: str) -> bool: ...


class HasApiVersions(Protocol):
    def api_versions_response(self, version: int) -> Any: ...


class ClusterApiPort(Authorizing, HasNodeId, HasClusterId, HasConfig, HasMetadata,
                     HasApiVersions, Protocol):
    """ApiVersions, Metadata, DescribeCluster, FindCoordinator (handlers/cluster.py,
    handlers/coordinator.py)."""


class AdminApiPort(Authorizing, HasNodeId, HasConfig, HasMetadata, HasReplication,
                   HasFetchSessions, Protocol):
    """Topics, partitions and configs (handlers/admin.py, handlers/partitions.py,
    handlers/configs.py)."""


class GroupApiPort(Authorizing, HasMetadata, HasGroupCoordinator, HasTxnVerifier, Protocol):
    """The group coordinator's requests (handlers/group.py)."""


class TxnApiPort(Authorizing, HasTransactionVersion, HasTxnCoordinator, HasGroupCoordinator,
                 HasTxnMarkers, HasProducerIds, Protocol):
    """Producer ids, the transaction coordinator's requests and the markers
    (handlers/producer_id.py, handlers/txn.py, handlers/txn_markers.py)."""


class ReplicaApiPort(Authorizing, HasReplication, HasTopics, Protocol):
    """What the partitions hosted here answer besides produce and fetch: ListOffsets,
    OffsetForLeaderEpoch, DescribeLogDirs, DescribeProducers."""


class SecurityApiPort(Authorizing, HasSecurity, Protocol):
    """SASL, the ACLs and the SCRAM users (handlers/security.py, handlers/scram.py)."""


class BrokerPort(ClusterApiPort, AdminApiPort, GroupApiPort, TxnApiPort, ReplicaApiPort,
                 SecurityApiPort, HasStats, Protocol):
    """The broker as a request handler sees it: every family's port (produce and fetch take it
    whole: they use most of it)."""


Handler = Callable[[BrokerPort, RequestContext, Any], Awaitable[Any]]
"""One API's request handler: the response (a kio entity of the request's version, or a
hand-encoded writer), or None when none is owed."""
