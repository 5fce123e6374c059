"""The ACL checks the handlers make (spec 000 "Authorization", KIP-939 "ACL Changes"), one call
each; all allowed when the broker runs without an authorizer."""

from __future__ import annotations

from ...security.acls import SUPPORTED_OPERATIONS, Operation, ResourceType
from ..context import RequestContext
from ..ports import Authorizing

Op, R = Operation, ResourceType


def topic(broker: Authorizing, ctx: RequestContext, op: Operation, name: str) -> bool:
    return broker.allowed(ctx, op, R.TOPIC, name)


def group(broker: Authorizing, ctx: RequestContext, op: Operation, name: str) -> bool:
    return broker.allowed(ctx, op, R.GROUP, name)


def transactional_id(broker: Authorizing, ctx: RequestContext, op: Operation, name: str) -> bool:
    return broker.allowed(ctx, op, R.TRANSACTIONAL_ID, name)


def cluster(broker: Authorizing, ctx: RequestContext, op: Operation) -> bool:
    return broker.allowed(ctx, op, R.CLUSTER, "kafka-cluster")


def topics_checker(broker: Authorizing, ctx: RequestContext, op: Operation):
    """A cached ``name -> allowed`` for one request (a dict: functools.cache cost more to make,
    once per Produce and Fetch, than the lookups it saved)."""
    seen: dict[str, bool] = {}

    def check(name: str) -> bool:
        allowed = seen.get(name)
        if allowed is None:
            allowed = seen[name] = topic(broker, ctx, op, name)
        return allowed

    return check


# KIP-430: what a response says when the client did not ask for the authorized operations
# (Kafka's Int.MinValue, the schemas' default).
OPERATIONS_OMITTED = -(2**31)


def authorized_operations(broker: Authorizing, ctx: RequestContext,
                          resource_type: ResourceType, name: str) -> int:
    """KIP-430: the operations of the resource type (Kafka's supportedOperations) the
    request's principal may do on the resource, as Kafka's bit field (``1 << code``). Without
    an authorizer every one, as Kafka without an authorizer."""
    return sum(1 << int(op) for op in SUPPORTED_OPERATIONS[resource_type]
               if broker.allowed(ctx, op, resource_type, name))


def cluster_operations(broker: Authorizing, ctx: RequestContext, asked: bool) -> int:
    """KIP-430's cluster operations, as Kafka answers them: omitted unless asked, 0 without
    Describe on the cluster."""
    if not asked:
        return OPERATIONS_OMITTED
    if not cluster(broker, ctx, Op.DESCRIBE):
        return 0
    return authorized_operations(broker, ctx, R.CLUSTER, "kafka-cluster")
