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
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    DESCRIBE_CONFIGS = 32
    DESCRIBE_CLUSTER = 60


API_NAMES = {k.value: k.name for k in ApiKey}

# (min, max) inclusive. Only versions whose every field the broker honours:
#  - Produce 3-11: v12 promises KIP-890 implicit AddPartitions, a later issue.
#  - Fetch 4-12: v13+ names topics by id only.
#  - ListOffsets 1-7: -1 latest, -2 earliest, -3 max timestamp, or a timestamp lookup.
#  - Metadata 0-12, DeleteTopics 1-5 (v6 deletes by topic id), the others their kio range.
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 11),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.METADATA: (0, 12),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 5),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
}
