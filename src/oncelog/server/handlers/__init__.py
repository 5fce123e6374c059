"""One module per API family. Each handler is ``async (broker, ctx, request) -> response``
(a kio response entity of the request's version, or None when no response is owed), typed
against the broker's ports (server/ports.py ``Handler``)."""

from ...protocol import ApiKey
from ..ports import Handler
from . import (
    admin,
    cluster,
    configs,
    coordinator,
    fetch,
    group,
    leader_epoch,
    list_offsets,
    log_dirs,
    partitions,
    produce,
    producer_id,
    producers,
    scram,
    security,
    txn,
    txn_markers,
)

# One table per API family, as in protocol/apis.py; HANDLERS is their union.
_LOG_AND_WIRE: dict[ApiKey, Handler] = {
    ApiKey.API_VERSIONS: cluster.handle_api_versions,
    ApiKey.METADATA: cluster.handle_metadata,
    ApiKey.DESCRIBE_CLUSTER: cluster.handle_describe_cluster,
    ApiKey.CREATE_TOPICS: admin.handle_create_topics,
    ApiKey.DELETE_TOPICS: admin.handle_delete_topics,
    ApiKey.DESCRIBE_CONFIGS: configs.handle_describe_configs,
    ApiKey.PRODUCE: produce.handle_produce,
    ApiKey.FETCH: fetch.handle_fetch,
    ApiKey.LIST_OFFSETS: list_offsets.handle_list_offsets,
    ApiKey.INIT_PRODUCER_ID: producer_id.handle_init_producer_id,
    # Both coordinators: which broker coordinates a group id or a transactional id.
    ApiKey.FIND_COORDINATOR: coordinator.handle_find_coordinator,
    # The partition leader's half of ending a transaction (the log writes the markers).
    ApiKey.WRITE_TXN_MARKERS: txn_markers.handle_write_txn_markers,
    ApiKey.DESCRIBE_PRODUCERS: producers.handle_describe_producers,
    # Cluster mode: where a leader epoch ends (followers' truncation, KIP-320 clients).
    ApiKey.OFFSET_FOR_LEADER_EPOCH: leader_epoch.handle_offset_for_leader_epoch,
    # A topic grows; a partition's log start moves (KIP-107).
    ApiKey.CREATE_PARTITIONS: partitions.handle_create_partitions,
    ApiKey.DELETE_RECORDS: partitions.handle_delete_records,
    ApiKey.ALTER_CONFIGS: configs.handle_alter_configs,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: configs.handle_incremental_alter_configs,
    ApiKey.DESCRIBE_LOG_DIRS: log_dirs.handle_describe_log_dirs,  # KIP-113
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: cluster.handle_describe_topic_partitions,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: configs.handle_describe_client_quotas,
}


# The transaction coordinator and the markers it writes:
_TRANSACTIONS: dict[ApiKey, Handler] = {
    ApiKey.ADD_PARTITIONS_TO_TXN: txn.handle_add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: txn.handle_add_offsets_to_txn,
    ApiKey.END_TXN: txn.handle_end_txn,
    ApiKey.DESCRIBE_TRANSACTIONS: txn.handle_describe_transactions,
    ApiKey.LIST_TRANSACTIONS: txn.handle_list_transactions,
}


# The group coordinator:
_GROUPS: dict[ApiKey, Handler] = {
    ApiKey.JOIN_GROUP: group.handle_join_group,
    ApiKey.SYNC_GROUP: group.handle_sync_group,
    ApiKey.HEARTBEAT: group.handle_heartbeat,
    ApiKey.LEAVE_GROUP: group.handle_leave_group,
    ApiKey.OFFSET_COMMIT: group.handle_offset_commit,
    ApiKey.OFFSET_FETCH: group.handle_offset_fetch,
    ApiKey.TXN_OFFSET_COMMIT: group.handle_txn_offset_commit,
    ApiKey.DESCRIBE_GROUPS: group.handle_describe_groups,
    ApiKey.LIST_GROUPS: group.handle_list_groups,
    ApiKey.DELETE_GROUPS: group.handle_delete_groups,
    ApiKey.OFFSET_DELETE: group.handle_offset_delete,
}


# Security: SASL and ACLs.
_SECURITY: dict[ApiKey, Handler] = {
    ApiKey.SASL_HANDSHAKE: security.handle_sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: security.handle_sasl_authenticate,
    ApiKey.CREATE_ACLS: security.handle_create_acls,
    ApiKey.DESCRIBE_ACLS: security.handle_describe_acls,
    ApiKey.DELETE_ACLS: security.handle_delete_acls,
    # KIP-554: the SCRAM users.
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: scram.handle_describe_user_scram_credentials,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: scram.handle_alter_user_scram_credentials,
}


HANDLERS: dict[ApiKey, Handler] = {**_LOG_AND_WIRE, **_TRANSACTIONS, **_GROUPS, **_SECURITY}
