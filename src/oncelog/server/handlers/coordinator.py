"""FindCoordinator: which broker is the group coordinator of a group id, or the transaction
coordinator of a transactional id (spec 000, "Data Flow" step 1).

The coordinator is the leader of the key's partition of the internal topic
(``__consumer_offsets`` or ``__transaction_state``), which the first request creates, as Kafka
does (COORDINATOR_NOT_AVAILABLE while the partition has no leader, or while the topic is being
created; a cluster of one creates it at once).
v4 (KIP-699) asks for several keys at once; earlier versions for one.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ..context import RequestContext
from ..ports import ClusterApiPort
from ..topics import CONSUMER_OFFSETS, TRANSACTION_STATE, TopicError
from . import acl
from .util import error_code

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
_NOWHERE = (-1, "", -1)
_TOPIC_OF_KEY_TYPE = {KEY_TYPE_GROUP: CONSUMER_OFFSETS, KEY_TYPE_TRANSACTION: TRANSACTION_STATE}


def _find(broker: ClusterApiPort, key_type: int, key: str | None
          ) -> tuple[ErrorCode | None, str | None, tuple]:
    """(error name, message, (node id, host, port)) for one key."""
    topic = _TOPIC_OF_KEY_TYPE.get(key_type)
    if topic is None:
        return ErrorCode.invalid_request, f"unknown coordinator key type {key_type}", _NOWHERE
    if not key:
        if key_type == KEY_TYPE_TRANSACTION:
            return ErrorCode.invalid_request, "empty transactional id", _NOWHERE
        return ErrorCode.invalid_group_id, "empty group id", _NOWHERE
    # The leader of the key's partition of the internal topic (a topic that cannot be
    # created, e.g. on a full disk, is COORDINATOR_NOT_AVAILABLE, as Kafka answers).
    try:
        err, node = broker.metadata.coordinator_of(topic, key)
    except TopicError as exc:
        return ErrorCode.coordinator_not_available, str(exc), _NOWHERE
    if err is not None:
        return err, "the coordinator is not available yet", _NOWHERE
    info = broker.metadata.view.brokers[node]
    return None, None, (node, info.host, info.port)


async def handle_find_coordinator(broker: ClusterApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.FIND_COORDINATOR, ctx.version)
    key_type = getattr(request, "key_type", KEY_TYPE_GROUP)
    def find(key):
        rtype = acl.R.TRANSACTIONAL_ID if key_type == 1 else acl.R.GROUP
        if not broker.allowed(ctx, acl.Op.DESCRIBE, rtype, key):
            return ((ErrorCode.transactional_id_authorization_failed if key_type == 1
                     else ErrorCode.group_authorization_failed), "not authorized", _NOWHERE)
        return _find(broker, key_type, key)

    if ctx.version < 4:
        err, msg, (node, host, port) = find(request.key)
        return make(mod.FindCoordinatorResponse, throttle_time=0, error_code=error_code(err),
                    error_message=msg, node_id=node, host=host, port=port)
    coordinators = []
    for key in request.coordinator_keys:
        err, msg, (node, host, port) = find(key)
        coordinators.append(make(
            mod.Coordinator, key=key, node_id=node, host=host, port=port,
            error_code=error_code(err), error_message=msg))
    return make(mod.FindCoordinatorResponse, throttle_time=0, coordinators=tuple(coordinators))
