"""FindCoordinator: which broker is the group coordinator of a group id, or the transaction
coordinator of a transactional id (spec 000, "Data Flow" step 1).

A single node coordinates everything, but the coordinator's log must exist: the first request
creates the internal topic (``__consumer_offsets`` or ``__transaction_state``), as Kafka does.
v4 (KIP-699) asks for several keys at once; earlier versions for one.
"""

from __future__ import annotations

from ...protocol import ApiKey, make, response_module
from ..clock import now_ms
from ..topics import CONSUMER_OFFSETS, TRANSACTION_STATE
from . import acl
from .util import error_code

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
_TOPIC_OF_KEY_TYPE = {KEY_TYPE_GROUP: CONSUMER_OFFSETS, KEY_TYPE_TRANSACTION: TRANSACTION_STATE}


def _find(broker, key_type: int, key: str | None) -> tuple[str | None, str | None]:
    """(error name, message) for one key; (None, None) when this broker coordinates it."""
    topic = _TOPIC_OF_KEY_TYPE.get(key_type)
    if topic is None:
        return "invalid_request", f"unknown coordinator key type {key_type}"
    if not key:
        if key_type == KEY_TYPE_TRANSACTION:
            return "invalid_request", "empty transactional id"
        return "invalid_group_id", "empty group id"
    broker.topics.ensure_internal(topic, now_ms())
    return None, None


async def handle_find_coordinator(broker, ctx, request):
    mod = response_module(ApiKey.FIND_COORDINATOR, ctx.version)
    key_type = getattr(request, "key_type", KEY_TYPE_GROUP)
    def find(key):
        rtype = acl.R.TRANSACTIONAL_ID if key_type == 1 else acl.R.GROUP
        if not broker.allowed(ctx, acl.Op.DESCRIBE, rtype, key):
            return (("transactional_id_authorization_failed" if key_type == 1
                     else "group_authorization_failed"), "not authorized")
        return _find(broker, key_type, key)

    if ctx.version < 4:
        err, msg = find(request.key)
        ok = err is None
        return make(mod.FindCoordinatorResponse, throttle_time=0, error_code=error_code(err),
                    error_message=msg, node_id=broker.node_id if ok else -1,
                    host=broker.host if ok else "", port=broker.port if ok else -1)
    coordinators = []
    for key in request.coordinator_keys:
        err, msg = find(key)
        ok = err is None
        coordinators.append(make(
            mod.Coordinator, key=key, node_id=broker.node_id if ok else -1,
            host=broker.host if ok else "", port=broker.port if ok else -1,
            error_code=error_code(err), error_message=msg))
    return make(mod.FindCoordinatorResponse, throttle_time=0, coordinators=tuple(coordinators))
