"""The broker's state and request dispatch, independent of sockets.

``Broker`` owns the data directory: topics and their partition logs, producer-id allocation,
fetch sessions, and periodic maintenance. ``handle_frame`` takes one request frame and returns
the response frame (or None when none is owed, as for acks=0 produce); the network edge
(server/network.py) only moves frames.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from pathlib import Path
from time import perf_counter

from kio.schema.errors import ErrorCode

from .. import protocol
from ..log.log_cleaner import LogCleaner
from ..log.preallocator import Preallocator
from ..protocol import ApiKey, ProtocolError
from ..protocol.apis import TRANSACTION_VERSION_FEATURE, supported_versions
from ..protocol.error_response import error_response
from . import dynamic_config
from .broker_stats import BrokerStats
from .clock import now_ms
from .config import BrokerConfig
from .context import CloseConnection, RequestContext, Session
from .coordinator_runtime import ReplicaPartitionWriter
from .dir_lock import DataDirLock
from .fetch_sessions import FetchSessionCache
from .group_service import GroupService
from .metadata import Metadata, ProducerIds
from .metadata_local import LocalMetadata
from .replication import ReplicaManager
from .security_service import PRE_AUTHENTICATION, Security
from .stable_offsets import StableOffsetWatch
from .topics import CONSUMER_OFFSETS, TRANSACTION_STATE, TopicManager
from .txn_marker_writer import TxnMarkerWriter
from .txn_service import TxnService
from .txn_verification import TxnVerifier

log = logging.getLogger("oncelog.broker")

# Requests larger than this are decoded, and their answers encoded, off the event loop: a
# Metadata request naming 300,000 topics (7.5 MB) held every other client for seconds.
LARGE_REQUEST_BYTES = 1 << 20

INITIAL_TASK_DELAY_MS = 30_000  # Kafka's LogManager.InitialTaskDelayMs


class Broker:
    def __init__(self, data_dir: str | Path, config: BrokerConfig | None = None,
                 host: str = "127.0.0.1", port: int = 9092) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Before anything in the directory is read or written (Kafka's LogManager lockLogDirs).
        self.dir_lock = DataDirLock(self.data_dir)
        try:
            self._open(config, host, port)
        except BaseException:
            self.dir_lock.release()
            raise

    def _open(self, config: BrokerConfig | None, host: str, port: int) -> None:
        self.config = config or BrokerConfig()
        self.node_id = self.config.int("node.id")
        self.host = host
        self.port = port  # the advertised port; set by the server once bound
        cluster_id = self._load_cluster_id()
        self.transaction_version = self.config.int("transaction.version")
        self.supported_versions = supported_versions(self.transaction_version)
        self.preallocator = Preallocator()
        if not self.config.get("zookeeper.connect"):
            # A single node's dynamic broker configs, before its logs open (a cluster's come
            # from ZooKeeper once the broker joins).
            stored = dynamic_config.load_local(self.data_dir)
            self._layer_dynamic_configs(stored.get(dynamic_config.DEFAULT_ENTITY, {}),
                                        stored.get(str(self.node_id), {}))
        self.topics = TopicManager(self.data_dir, self.config, now_ms(), self.preallocator)
        self.fetch_sessions = FetchSessionCache()
        # Requests answered, by (api key, version): Kafka's RequestsPerSec{request,version}
        # (KIP-272), which shows the versions clients negotiate.
        self.request_counts: Counter[tuple[int, int]] = Counter()
        self.stats = BrokerStats()  # bytes, messages, latency, connections (metrics page)
        self.lso_watch = StableOffsetWatch()  # how long each LSO has stood below its HW
        # A single node is a cluster of one (server/metadata_local.py); with
        # zookeeper.connect, a broker of a ZooKeeper-coordinated cluster (docs/cluster.md).
        # The same code runs either way: the replica manager leads and follows partitions as
        # the metadata's view says, the coordinators follow their partitions' leadership.
        self.security = Security(self.config, self.data_dir)
        # The composition root: each service is given what it uses (ids, settings, the
        # services it calls, typed by small ports), never the broker. Where two need each
        # other, the second is wired to the first once both exist.
        kind: type[Metadata] = LocalMetadata
        if self.config.get("zookeeper.connect"):
            from .metadata_zk import ZkMetadata  # kazoo is loaded only when it is needed

            kind = ZkMetadata
        self.metadata = kind(
            self.node_id, self.config, self.data_dir, self.topics, cluster_id=cluster_id,
            credentials=self.security, on_dynamic_configs=self.apply_dynamic_configs,
            on_topic_deleted=self.fetch_sessions.remove_topic, listener=(host, port))
        # Kafka's ReplicaManager: ISR changes go to the metadata, whose views come back to it.
        self.replication = ReplicaManager(self.node_id, self.config, self.topics,
                                          isr_writer=self.metadata)
        self.metadata.view_listeners.append(self.replication.apply)
        self.producer_ids = ProducerIds(self.metadata)
        # The coordinators append to their topics through the replica manager, follow its
        # leadership news and load its logs (Kafka's CoordinatorRuntime with a PartitionWriter).
        self.group_coordinator = GroupService(
            self.config, writer=ReplicaPartitionWriter(self.replication, CONSUMER_OFFSETS),
            leadership=self.replication, partitions=self.topics, metadata=self.metadata)
        # The replica side of ending a transaction: the WriteTxnMarkers handler's, and this
        # broker's transaction coordinator's for the partitions it leads.
        self.txn_markers = TxnMarkerWriter(self.replication, self.group_coordinator)
        self.txn_coordinator = TxnService(
            self.node_id, self.config,
            writer=ReplicaPartitionWriter(self.replication, TRANSACTION_STATE),
            leadership=self.replication, partitions=self.topics, metadata=self.metadata,
            allocate_producer_id=self.producer_ids.next_producer_id, markers=self.txn_markers,
            client=self.replication.client)
        self.replication.load_details[TRANSACTION_STATE] = self.txn_coordinator.load_summary
        self.replication.load_details[CONSUMER_OFFSETS] = self.group_coordinator.load_summary
        self.txn_verifier = TxnVerifier(
            enabled=self.config.flag("transaction.partition.verification.enable"),
            node_id=self.node_id, metadata=self.metadata, coordinator=self.txn_coordinator,
            client=self.replication.client)
        self._maintenance_task: asyncio.Task | None = None
        self._retention_task: asyncio.Task | None = None
        # Kafka's LogCleaner: compacts the logs whose cleanup.policy has compact, on a thread
        # of its own (log/log_cleaner.py); None with log.cleaner.enable=false.
        self.log_cleaner: LogCleaner | None = None
        from .handlers import HANDLERS

        self.handlers = HANDLERS

    @property
    def cluster_id(self) -> str:
        """The data directory's (meta.properties), or the cluster's once it joined one."""
        return self.metadata.cluster_id

    def _load_cluster_id(self) -> str:
        """meta.properties, as Kafka writes it: cluster.id and node.id of this data dir."""
        path = self.data_dir / "meta.properties"
        props: dict[str, str] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if "=" in line and not line.startswith("#"):
                    k, v = line.split("=", 1)
                    props[k.strip()] = v.strip()
        if "cluster.id" not in props:
            props = {"version": "1", "cluster.id": uuid.uuid4().hex[:22],
                     "node.id": str(self.node_id)}
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            tmp.replace(path)
        return props["cluster.id"]

    # -- request dispatch ---------------------------------------------------------------------

    def new_session(self) -> Session:
        return Session(authenticated=not self.security.sasl_enabled)

    def allowed(self, ctx: RequestContext, operation, resource_type, name: str) -> bool:
        """Whether the request's principal may do ``operation`` on the resource (ACLs)."""
        if ctx.session is None:
            return True
        return self.security.authorizer.authorize(ctx.session.principal, ctx.host, operation,
                                                  resource_type, name)

    async def handle_frame(self, frame: bytes, client_address: str,
                           session: Session | None = None) -> list[bytes] | None:
        """Answer one request frame: the response frame as parts to write in order (record sets
        are not copied into one buffer), or None when no response is owed. Raises
        CloseConnection when the only answer is to hang up."""
        if session is None:
            session = Session()
        if session.raw_tokens:
            return await self.security.raw_token(session, frame, client_address)
        try:
            header = protocol.parse_request_header(frame)
        except ProtocolError as exc:
            raise CloseConnection(f"unparseable request header: {exc}") from None
        api_key, version = header.api_key, header.api_version
        supported = self.supported_versions.get(api_key)
        if api_key == ApiKey.API_VERSIONS and (supported is None or
                                               not supported[0] <= version <= supported[1]):
            # KIP-511: an ApiVersions request of a version we lack is answered in v0 with
            # UNSUPPORTED_VERSION and our ranges, so that the client can retry with one we have.
            return protocol.encode_response_parts(
                header.correlation_id,
                self.api_versions_response(0, ErrorCode.unsupported_version),
            )
        if supported is None:
            raise CloseConnection(f"unknown api key {api_key}")
        if self.metadata.view is None and api_key != ApiKey.API_VERSIONS:
            # Bound and registering, but without the cluster's view yet.
            raise CloseConnection(f"{protocol.API_NAMES[api_key]} before this broker joined "
                                  "the cluster")
        if not session.authenticated and api_key not in PRE_AUTHENTICATION:
            raise CloseConnection(f"{protocol.API_NAMES[api_key]} before SASL authentication")
        if not supported[0] <= version <= supported[1]:
            raise CloseConnection(
                f"unsupported version {version} of {protocol.API_NAMES[api_key]} "
                f"(supported {supported[0]}-{supported[1]})"
            )
        started = perf_counter()
        large = len(frame) > LARGE_REQUEST_BYTES
        try:
            if large:  # decoding a huge request must not stall every other connection
                request = await asyncio.to_thread(protocol.decode_request_body, header, frame)
            else:
                request = protocol.decode_request_body(header, frame)
        except ProtocolError as exc:
            raise CloseConnection(str(exc)) from None
        ctx = RequestContext(header, client_address, session)
        self.request_counts[api_key, version] += 1
        try:
            response = await self.handlers[ApiKey(api_key)](self, ctx, request)
            if response is None:
                return None
            self.stats.response_errors(api_key, response)  # ErrorsPerSec
            if large:  # nor encoding its answer (the thread lets the loop run between slices)
                return await asyncio.to_thread(protocol.encode_response_parts,
                                               header.correlation_id, response)
            return protocol.encode_response_parts(header.correlation_id, response)
        except (CloseConnection, asyncio.CancelledError):
            raise
        except Exception:
            # As Kafka's KafkaApis.handleError: log, and answer the request with
            # UNKNOWN_SERVER_ERROR for everything it named; the connection stays open.
            log.exception("%s v%d from %s failed unexpectedly; answered UNKNOWN_SERVER_ERROR",
                          protocol.API_NAMES[api_key], version, client_address)
            if api_key == ApiKey.PRODUCE and request.acks == 0:
                # Never answered: closing is how Kafka tells an acks=0 producer.
                raise CloseConnection("a Produce with acks=0 failed") from None
            if api_key == ApiKey.PRODUCE:  # read by hand: not a kio entity to mirror
                from .handlers.produce import answer_every_partition
                response = answer_every_partition(version, request, ErrorCode.unknown_server_error,
                                                  "the broker failed to handle the request")
            else:
                response = error_response(protocol.response_class(api_key, version), request)
            self.stats.response_errors(api_key, response)
            return protocol.encode_response_parts(header.correlation_id, response)
        finally:
            self.stats.request_done(api_key, started)

    def api_versions_response(self, version: int, error: ErrorCode = ErrorCode.none):
        mod = protocol.response_module(ApiKey.API_VERSIONS, version)
        keys = tuple(
            protocol.make(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(self.supported_versions.items())
        )
        features = {}
        if version >= 3:
            # KIP-584 features; KIP-890's transaction.version, finalized at this broker's level.
            features = {
                "supported_features": (protocol.make(
                    mod.SupportedFeatureKey, name=TRANSACTION_VERSION_FEATURE, min_version=0,
                    max_version=2),),
                "finalized_features_epoch": 0,
                "finalized_features": (protocol.make(
                    mod.FinalizedFeatureKey, name=TRANSACTION_VERSION_FEATURE,
                    max_version_level=self.transaction_version,
                    min_version_level=self.transaction_version),)
                if self.transaction_version > 0 else (),
            }
        return protocol.make(mod.ApiVersionsResponse, error_code=error, api_keys=keys,
                             throttle_time=0, **features)

    def _layer_dynamic_configs(self, default: dict[str, str], own: dict[str, str]) -> None:
        config = self.config
        config.set_dynamic(
            dynamic_config.usable(config, default, "cluster default", per_broker=False),
            dynamic_config.usable(config, own, f"broker {self.node_id}", per_broker=True))

    def apply_dynamic_configs(self, default: dict[str, str], own: dict[str, str]) -> None:
        """The dynamic broker configs (cluster-wide default, this broker's own) changed: layer
        them over the static settings and give every log its new LogConfig."""
        self._layer_dynamic_configs(default, own)
        self.topics.reconfigure()
        self.txn_verifier.enabled = self.config.flag(
            "transaction.partition.verification.enable")

    # -- maintenance --------------------------------------------------------------------------

    async def join_cluster(self) -> None:
        """Once the socket is bound: the lock file names the address, the broker joins its
        cluster (registers; a cluster of one elects itself) and takes up the roles the first
        view gives it, its coordinators loading the partitions it leads."""
        self.dir_lock.record_address(self.host, self.port)
        self.metadata.listener = (self.host, self.port)
        self.replication.start()
        await self.metadata.start()

    def start_maintenance(self, interval_s: float = 1.0) -> None:
        self._maintenance_task = asyncio.get_running_loop().create_task(
            self._maintain_forever(interval_s))
        self._retention_task = asyncio.get_running_loop().create_task(self._retain_forever())
        if self.config.flag("log.cleaner.enable"):
            self.log_cleaner = LogCleaner(
                lambda: ((f"{p.topic}-{p.index}", p.log) for p in self.topics.all_partitions()),
                memory_bytes=self.config.int("log.cleaner.dedupe.buffer.size"),
                backoff_ms=self.config.int("log.cleaner.backoff.ms"),
                io_bytes_per_second=self.config.int("log.cleaner.io.max.bytes.per.second"),
                clock=now_ms)
            self.log_cleaner.start(asyncio.get_running_loop())
        self.txn_coordinator.start()
        self.group_coordinator.start()

    async def _maintain_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.maintain(now_ms())

    async def _retain_forever(self) -> None:
        """Kafka's kafka-log-retention task: every ``log.retention.check.interval.ms``, the
        first run after Kafka's initial task delay (30 s) or one interval if shorter."""
        interval_ms = self.config.int("log.retention.check.interval.ms")
        await asyncio.sleep(min(interval_ms, INITIAL_TASK_DELAY_MS) / 1000)
        while True:
            self.apply_retention(now_ms())
            await asyncio.sleep(interval_ms / 1000)

    def apply_retention(self, now: int) -> None:
        for p in list(self.topics.all_partitions()):
            try:
                p.log.apply_retention(now)
            except Exception:  # one partition's failure must not stop the others' retention
                log.exception("retention of %s-%d failed", p.topic, p.index)

    def maintain(self, now: int) -> None:
        self.lso_watch.observe(self.topics.all_partitions(), now)
        for p in list(self.topics.all_partitions()):
            try:
                p.log.maintain(now)
            except OSError:
                log.exception("maintenance of %s-%d failed", p.topic, p.index)

    def close(self) -> None:
        """Clean shutdown: every log flushed, producer state snapshotted, marked clean."""
        if self._maintenance_task is not None:
            self._maintenance_task.cancel()
        if self._retention_task is not None:
            self._retention_task.cancel()
        if self.log_cleaner is not None:
            self.log_cleaner.stop()  # before the logs close: no swap into a closed log
        self.metadata.close()
        self.replication.close()
        self.txn_verifier.close()
        self.txn_coordinator.close()
        self.group_coordinator.close()
        self.topics.close(now_ms())
        self.preallocator.stop()
        self.dir_lock.release()
