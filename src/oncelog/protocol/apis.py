"""API keys and the versions oncelog handles fully (advertised in ApiVersions).

Both sides read this table: the broker advertises it, our client picks the highest version
both it and the broker support.
"""

from __future__ import annotations

import enum


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    OFFSET_FOR_LEADER_EPOCH = 23
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    ALTER_CONFIGS = 33
    INCREMENTAL_ALTER_CONFIGS = 44
    DESCRIBE_LOG_DIRS = 35
    DESCRIBE_CLIENT_QUOTAS = 48
    DESCRIBE_TOPIC_PARTITIONS = 75


API_NAMES = {k.value: k.name for k in ApiKey}

# (min, max) inclusive. Only versions whose every field the broker honours. One table per API
# family (kept apart so that each family's changes stay in its own lines); the broker advertises
# their union, SUPPORTED_VERSIONS.
#
# The log and the wire (foundation):
#  - Produce 3-12: v12 is KIP-890's transaction version 2 (the leader adds the partition to the
#    transaction itself; non-zero first sequence of an unknown producer: OUT_OF_ORDER_SEQUENCE).
#  - Fetch 4-17: v13+ names topics by id only (KIP-516), v15 moves the follower's id into
#    replica_state (KIP-903), v16 adds the new leader to NOT_LEADER_OR_FOLLOWER (KIP-951).
#  - ListOffsets 1-7: -1 latest, -2 earliest, -3 max timestamp, or a timestamp lookup.
#  - Metadata 0-12 (v10+ answers topic ids, v12 looks topics up by id), DeleteTopics 1-6 (v6
#    deletes by name or topic id, KIP-516), the others their kio range.
_LOG_AND_WIRE: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 12),
    ApiKey.FETCH: (4, 17),
    ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.METADATA: (0, 12),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.INIT_PRODUCER_ID: (0, 6),  # v5 TRANSACTION_ABORTABLE, v6 two-phase commit (KIP-939)
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.FIND_COORDINATOR: (0, 4),  # v5+ adds share groups (KIP-932)
    ApiKey.WRITE_TXN_MARKERS: (1, 2),  # v0 is v1 without tagged fields (not in kio); v2 KIP-1228
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.CREATE_PARTITIONS: (0, 3),  # v2+ flexible, v3 as v2 (KIP-599 quotas' version)
    ApiKey.DELETE_RECORDS: (0, 2),  # KIP-107; v2 flexible
    # Topic overrides and dynamic broker configs (server/handlers/configs.py).
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),  # KIP-339
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),  # KIP-113; v3 top-level error, v4 total/usable bytes
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),  # KIP-966 (paged; the ELR lists are empty)
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),  # KIP-546: oncelog has no client quotas (none set)
}


# The transaction coordinator (txn/) and the markers it writes (KIP-98, KIP-360, KIP-890):
# AddPartitionsToTxn v4+ is the brokers' (batched, verifyOnly), v5 and AddOffsetsToTxn v4 /
# EndTxn v4 add TRANSACTION_ABORTABLE, EndTxn v5 is transaction version 2 (an epoch bump per
# transaction, the new id and epoch in the answer).
_TRANSACTIONS: dict[int, tuple[int, int]] = {
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 5),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
}


# The group coordinator (group/): the classic group protocol and (transactional) offsets:
# OffsetCommit v9+ / OffsetFetch v9+ carry KIP-848 member epochs, JoinGroup has no v10;
# kio has no OffsetCommit v0-1 nor OffsetFetch v0.
_GROUPS: dict[int, tuple[int, int]] = {
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.OFFSET_COMMIT: (2, 8),
    ApiKey.OFFSET_FETCH: (1, 8),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),  # v5: transaction version 2 (the partition is added)
    ApiKey.DESCRIBE_GROUPS: (0, 6),  # v6: an unknown group is GROUP_ID_NOT_FOUND (KIP-1043)
    ApiKey.LIST_GROUPS: (0, 5),  # v4 states filter (KIP-518), v5 types filter (KIP-848)
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),  # KIP-496 (kio knows v0)
}


# Security (server/security_service.py): SASL (KIP-43, KIP-152) and the ACL admin APIs; kio has
# no v0 of the ACL APIs.
_SECURITY: dict[int, tuple[int, int]] = {
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),  # KIP-554
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}


# Replication (server/replication.py): followers (v3+ names the replica) and clients (KIP-320,
# v2+) ask where a leader epoch ends.
_REPLICATION: dict[int, tuple[int, int]] = {
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
}


SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {**_LOG_AND_WIRE, **_TRANSACTIONS, **_GROUPS,
                                                  **_SECURITY, **_REPLICATION}

# KIP-890: the versions that mean "transaction version 2". A broker whose transaction.version
# feature is below 2 does not offer them, so every client uses the older protocol with it.
TRANSACTION_V2_VERSIONS: dict[int, int] = {
    ApiKey.PRODUCE: 12,
    ApiKey.END_TXN: 5,
    ApiKey.TXN_OFFSET_COMMIT: 5,
}
TRANSACTION_VERSION_FEATURE = "transaction.version"


def supported_versions(transaction_version: int = 2) -> dict[int, tuple[int, int]]:
    """The versions a broker with this transaction.version feature level offers."""
    out = dict(SUPPORTED_VERSIONS)
    if transaction_version >= 2:
        return out
    for key, first_v2 in TRANSACTION_V2_VERSIONS.items():
        lo, hi = out[key]
        out[key] = (lo, min(hi, first_v2 - 1))
    return out
