"""The ACL checks the handlers make (spec 000 "Authorization", KIP-939 "ACL Changes"), one call
each; all allowed when the broker runs without SASL."""

from __future__ import annotations

from functools import cache

from ...security.acls import Operation, ResourceType

Op, R = Operation, ResourceType


def topic(broker, ctx, op: Operation, name: str) -> bool:
    return broker.allowed(ctx, op, R.TOPIC, name)


def group(broker, ctx, op: Operation, name: str) -> bool:
    return broker.allowed(ctx, op, R.GROUP, name)


def transactional_id(broker, ctx, op: Operation, name: str) -> bool:
    return broker.allowed(ctx, op, R.TRANSACTIONAL_ID, name)


def cluster(broker, ctx, op: Operation) -> bool:
    return broker.allowed(ctx, op, R.CLUSTER, "kafka-cluster")


def topics_checker(broker, ctx, op: Operation):
    """A cached ``name -> allowed`` for one request."""
    @cache
    def check(name: str) -> bool:
        return topic(broker, ctx, op, name)

    return check
