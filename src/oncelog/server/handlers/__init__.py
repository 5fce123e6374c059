"""One module per API family. Each handler is ``async (broker, ctx, request) -> response``
(a kio response entity of the request's version, or None when no response is owed)."""

from ...protocol import ApiKey
from . import admin, cluster, fetch, list_offsets, produce, producer_id

HANDLERS = {
    ApiKey.API_VERSIONS: cluster.handle_api_versions,
    ApiKey.METADATA: cluster.handle_metadata,
    ApiKey.DESCRIBE_CLUSTER: cluster.handle_describe_cluster,
    ApiKey.CREATE_TOPICS: admin.handle_create_topics,
    ApiKey.DELETE_TOPICS: admin.handle_delete_topics,
    ApiKey.DESCRIBE_CONFIGS: admin.handle_describe_configs,
    ApiKey.PRODUCE: produce.handle_produce,
    ApiKey.FETCH: fetch.handle_fetch,
    ApiKey.LIST_OFFSETS: list_offsets.handle_list_offsets,
    ApiKey.INIT_PRODUCER_ID: producer_id.handle_init_producer_id,
}
