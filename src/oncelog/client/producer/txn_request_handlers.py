"""The transaction manager's coordinator requests (Kafka's TxnRequestHandler and its
subclasses): each builds its request from the manager's state, and on the answer moves the
manager on through the methods it offers them (``fail``, ``initialized``, ``ended``) and its
fields. Retries (coordinator moved or busy) are the coordinator loop's
(client/coordinator_request.py). They run under the manager's lock, on the sender's thread.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    FatalError,
    KafkaError,
    OperationNotAttemptedError,
    UnsupportedVersionError,
    error_for_code,
)
from ...protocol import ApiKey
from ..coordinator_request import (
    COORDINATOR_MOVED,
    KEY_TYPE_GROUP,
    Action,
    BrokerVersions,
    CoordinatorRequestHandler,
)
from ..errors import KafkaTimeoutError, TransactionError
from ..types import ConsumerGroupMetadata, TopicPartition


class TransactionManager(Protocol):
    """What the handlers read and call of the transaction manager
    (client/producer/transaction_manager.py), which holds their state."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    two_phase: bool
    transaction_v2: bool
    partitions: set[TopicPartition]
    offsets_added: bool

    def fail(self, error: KafkaError) -> KafkaError: ...

    def initialized(self, response: Any, broker: BrokerVersions, keep_prepared_txn: bool,
                    bump: bool) -> None: ...

    def ended(self, commit: bool, response: Any | None) -> TxnRequestHandler | None: ...

# The last versions of the older protocol (transaction version 0/1).
_V1_MAX = {ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 3}
# AddPartitionsToTxn v4+ is the brokers' (verification, batched by transactional id).
_CLIENT_MAX = {ApiKey.ADD_PARTITIONS_TO_TXN: 3}
_BUSY = (CoordinatorLoadInProgressError.code, ConcurrentTransactionsError.code)
_OPERATION_NOT_ATTEMPTED = OperationNotAttemptedError.code


class TxnRequestHandler(CoordinatorRequestHandler):
    """A request of the transaction manager. ``handle_response`` runs under the manager's
    lock and moves its state on; a coordinator that moved or is busy is retried by the
    coordinator loop, any other error fails the transaction (``_fail``) or the producer."""

    follow_up: TxnRequestHandler | None = None

    def __init__(self, manager: TransactionManager) -> None:
        self.m = manager
        self.key = manager.transactional_id

    @property
    def max_version(self) -> int | None:
        return (_CLIENT_MAX if self.m.transaction_v2 else _V1_MAX).get(self.api)

    def timeout_error(self, last: BaseException | None) -> BaseException:
        return KafkaTimeoutError(f"transactional request did not complete in time: {last}")

    def error_code(self, response: Any) -> int:
        return int(response.error_code)

    def handle_response(self, response: Any) -> Action:
        code = self.error_code(response)
        if code in COORDINATOR_MOVED or code in _BUSY:
            return self.retriable(code, self.api.name)
        if code:
            raise self.m.fail(self.error(code))
        self.done(response)
        return Action.DONE

    def error(self, code: int) -> KafkaError:
        return _txn_error(code, self.api.name)

    def done(self, response: Any) -> None:
        pass


class InitProducerIdHandler(TxnRequestHandler):
    api = ApiKey.INIT_PRODUCER_ID

    def __init__(self, manager: TransactionManager, producer_id: int, producer_epoch: int,
                 keep_prepared_txn: bool = False, bump: bool = False) -> None:
        super().__init__(manager)
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.keep_prepared_txn, self.bump = keep_prepared_txn, bump
        self.broker = BrokerVersions()

    def create_request(self, broker: BrokerVersions) -> dict[str, Any]:
        m = self.m
        if (m.two_phase or self.keep_prepared_txn) and \
                broker.api_versions.get(ApiKey.INIT_PRODUCER_ID, (0, 0))[1] < 6:
            raise m.fail(UnsupportedVersionError(
                "the transaction coordinator does not support two-phase commit "
                "(InitProducerId v6, KIP-939)"))
        self.broker = broker  # its versions decide the transaction version (KIP-890)
        return {"transactional_id": m.transactional_id,
                "transaction_timeout": -1 if m.two_phase else m.timeout_ms,
                "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "enable2_pc": m.two_phase, "keep_prepared_txn": self.keep_prepared_txn}

    def error(self, code: int) -> KafkaError:
        error = error_for_code(code)(f"InitProducerId {self.m.transactional_id!r}")
        return error if isinstance(error, FatalError) else TransactionError(
            f"InitProducerId failed: {error}")

    def done(self, response: Any) -> None:
        self.m.initialized(response, self.broker, self.keep_prepared_txn, self.bump)


class AddPartitionsToTxnHandler(TxnRequestHandler):
    api = ApiKey.ADD_PARTITIONS_TO_TXN

    def __init__(self, manager: TransactionManager, tps: list[TopicPartition]) -> None:
        super().__init__(manager)
        self.tps = tps

    def create_request(self, broker: BrokerVersions) -> dict[str, Any]:
        m = self.m
        topics: dict[str, list[int]] = {}
        for tp in self.tps:
            topics.setdefault(tp.topic, []).append(tp.partition)
        return {"v3_and_below_transactional_id": m.transactional_id,
                "v3_and_below_producer_id": m.producer_id,
                "v3_and_below_producer_epoch": m.producer_epoch,
                "v3_and_below_topics": [{"name": t, "partitions": p}
                                        for t, p in topics.items()]}

    def error_code(self, response: Any) -> int:
        return _partition_error(response)

    def error(self, code: int) -> KafkaError:
        named = ", ".join(f"{tp.topic}-{tp.partition}" for tp in self.tps[:5])
        more = f" and {len(self.tps) - 5} more" if len(self.tps) > 5 else ""
        return _txn_error(code, f"AddPartitionsToTxn {named}{more}")

    def done(self, response: Any) -> None:
        self.m.partitions.update(self.tps)


class AddOffsetsToTxnHandler(TxnRequestHandler):
    api = ApiKey.ADD_OFFSETS_TO_TXN

    def __init__(self, manager: TransactionManager, group_id: str,
                 then: TxnOffsetCommitHandler) -> None:
        super().__init__(manager)
        self.group_id = group_id
        self.follow_up = then

    def create_request(self, broker: BrokerVersions) -> dict[str, Any]:
        m = self.m
        return {"transactional_id": m.transactional_id, "producer_id": m.producer_id,
                "producer_epoch": m.producer_epoch, "group_id": self.group_id}

    def error(self, code: int) -> KafkaError:
        return _txn_error(code, f"AddOffsetsToTxn {self.group_id!r}")

    def done(self, response: Any) -> None:
        self.m.offsets_added = True


class TxnOffsetCommitHandler(TxnRequestHandler):
    """To the group's coordinator, not the transaction's."""

    api = ApiKey.TXN_OFFSET_COMMIT
    key_type = KEY_TYPE_GROUP

    def __init__(self, manager: TransactionManager, meta: ConsumerGroupMetadata,
                 by_topic: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__(manager)
        self.key = meta.group_id
        self.meta, self.by_topic = meta, by_topic

    def create_request(self, broker: BrokerVersions) -> dict[str, Any]:
        m, meta = self.m, self.meta
        return {"transactional_id": m.transactional_id, "group_id": meta.group_id,
                "producer_id": m.producer_id, "producer_epoch": m.producer_epoch,
                "generation_id": meta.generation_id, "member_id": meta.member_id,
                "group_instance_id": meta.group_instance_id,
                "topics": [{"name": t, "partitions": ps} for t, ps in self.by_topic.items()]}

    def error_code(self, response: Any) -> int:
        return _offset_commit_error(response)

    def error(self, code: int) -> KafkaError:
        return _txn_error(code, f"TxnOffsetCommit {self.meta.group_id!r}")


class EndTxnHandler(TxnRequestHandler):
    api = ApiKey.END_TXN

    def __init__(self, manager: TransactionManager, commit: bool) -> None:
        super().__init__(manager)
        self.commit = commit

    def create_request(self, broker: BrokerVersions) -> dict[str, Any]:
        m = self.m
        return {"transactional_id": m.transactional_id, "producer_id": m.producer_id,
                "producer_epoch": m.producer_epoch, "committed": self.commit}

    def error(self, code: int) -> KafkaError:
        return _txn_error(code, "EndTxn")

    def done(self, response: Any) -> None:
        self.follow_up = self.m.ended(self.commit, response)


def _txn_error(code: int, what: str) -> KafkaError:
    error = error_for_code(code)(what)
    return error if isinstance(error, FatalError) else TransactionError(f"{what}: {error}")


def _partition_error(response: Any) -> int:
    """The first partition's error; OPERATION_NOT_ATTEMPTED (the partitions the broker skipped
    because of another's error) only when it is the only one."""
    codes = [int(p.partition_error_code) for t in response.results_by_topic_v3_and_below
             for p in t.results_by_partition if int(p.partition_error_code)]
    return next((c for c in codes if c != _OPERATION_NOT_ATTEMPTED), codes[0] if codes else 0)


def _offset_commit_error(response: Any) -> int:
    for t in response.topics:
        for p in t.partitions:
            if int(p.error_code):
                return int(p.error_code)
    return 0
