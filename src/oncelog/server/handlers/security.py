"""SaslHandshake, SaslAuthenticate (server/security_service.py runs the exchange) and the ACL
admin APIs: CreateAcls, DescribeAcls, DeleteAcls (Alter / Describe on the Cluster)."""

from __future__ import annotations

import datetime
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ...security.acls import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from ..context import RequestContext
from ..ports import SecurityApiPort
from .util import error_code, requester

log = logging.getLogger("oncelog.broker.admin")


async def handle_sasl_handshake(broker: SecurityApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.SASL_HANDSHAKE, ctx.version)
    err = broker.security.handshake(ctx.session, request.mechanism, ctx.version)
    return make(mod.SaslHandshakeResponse, error_code=error_code(err),
                mechanisms=tuple(broker.security.mechanisms))


async def handle_sasl_authenticate(broker: SecurityApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.SASL_AUTHENTICATE, ctx.version)
    err, message, answer = await broker.security.authenticate(
        ctx.session, bytes(request.auth_bytes), ctx.client_address)
    return make(mod.SaslAuthenticateResponse, error_code=error_code(err), error_message=message,
                auth_bytes=answer, session_lifetime=datetime.timedelta(0))


def _enum(cls, value: int):
    try:
        return cls(int(value))
    except ValueError:
        return cls.UNKNOWN


def _cluster_allowed(broker: SecurityApiPort, ctx: RequestContext, operation: Operation) -> bool:
    return broker.allowed(ctx, operation, ResourceType.CLUSTER, "kafka-cluster")


def _binding(c) -> tuple[AclBinding | None, str | None]:
    rtype = _enum(ResourceType, c.resource_type)
    pattern = _enum(PatternType, c.resource_pattern_type)
    op = _enum(Operation, c.operation)
    perm = _enum(Permission, c.permission_type)
    if rtype in (ResourceType.UNKNOWN, ResourceType.ANY) or \
            pattern not in (PatternType.LITERAL, PatternType.PREFIXED) or \
            op in (Operation.UNKNOWN, Operation.ANY) or \
            perm not in (Permission.ALLOW, Permission.DENY):
        return None, "the ACL names an unknown or wildcard type, pattern, operation or permission"
    if not c.principal.startswith("User:") or len(c.principal) <= 5:
        return None, f"principal {c.principal!r} is not 'User:<name>'"
    if rtype == ResourceType.CLUSTER and c.resource_name != "kafka-cluster":
        return None, "the cluster resource is named 'kafka-cluster'"
    if not c.resource_name or not c.host:
        return None, "empty resource name or host"
    return AclBinding(rtype, c.resource_name, pattern, c.principal, c.host, op, perm), None


# Kafka without an authorizer refuses the ACL requests (SECURITY_DISABLED) rather than store
# ACLs that nothing would enforce. Ours is on with SASL or with authorizer.class.name set.
_NO_AUTHORIZER = (ErrorCode.security_disabled, ("No Authorizer is configured on the broker: set "
                                        "authorizer.class.name (or use SASL)"))


async def handle_create_acls(broker: SecurityApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.CREATE_ACLS, ctx.version)
    allowed = _cluster_allowed(broker, ctx, Operation.ALTER)
    results: list[tuple[ErrorCode | None, str | None]] = []
    good: list[AclBinding] = []
    for c in request.creations:
        if not broker.security.authorizer.enabled:
            results.append(_NO_AUTHORIZER)
            continue
        if not allowed:
            results.append((ErrorCode.cluster_authorization_failed, None))
            continue
        binding, problem = _binding(c)
        if binding is None:
            results.append((ErrorCode.invalid_request, problem))
        else:
            good.append(binding)
            results.append((None, None))
    if good:
        broker.security.authorizer.add(good)
        for binding in good:
            log.info("ACL added: %s, by %s", binding, requester(ctx))
    return make(mod.CreateAclsResponse, throttle_time=0, results=tuple(
        make(mod.AclCreationResult, error_code=error_code(e), error_message=m)
        for e, m in results))


def _filter(f) -> AclFilter:
    return AclFilter(_enum(ResourceType, f.resource_type_filter), f.resource_name_filter,
                     _enum(PatternType, f.pattern_type_filter), f.principal_filter,
                     f.host_filter, _enum(Operation, f.operation),
                     _enum(Permission, f.permission_type))


async def handle_describe_acls(broker: SecurityApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DESCRIBE_ACLS, ctx.version)
    if not broker.security.authorizer.enabled:
        return make(mod.DescribeAclsResponse, throttle_time=0,
                    error_code=error_code(_NO_AUTHORIZER[0]), error_message=_NO_AUTHORIZER[1],
                    resources=())
    if not _cluster_allowed(broker, ctx, Operation.DESCRIBE):
        return make(mod.DescribeAclsResponse, throttle_time=0,
                    error_code=ErrorCode.cluster_authorization_failed,
                    error_message="Describe on the cluster is needed", resources=())
    found = broker.security.authorizer.describe(_filter(request))
    by_resource: dict[tuple, list] = {}
    for b in found:
        by_resource.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            make(mod.AclDescription, principal=b.principal, host=b.host,
                 operation=int(b.operation), permission_type=int(b.permission)))
    return make(mod.DescribeAclsResponse, throttle_time=0, error_code=0, error_message=None,
                resources=tuple(make(mod.DescribeAclsResource, resource_type=int(rt),
                                     resource_name=name, pattern_type=int(pt), acls=tuple(acls))
                                for (rt, name, pt), acls in by_resource.items()))


async def handle_delete_acls(broker: SecurityApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DELETE_ACLS, ctx.version)
    if not broker.security.authorizer.enabled:
        return make(mod.DeleteAclsResponse, throttle_time=0, filter_results=tuple(
            make(mod.DeleteAclsFilterResult, error_code=error_code(_NO_AUTHORIZER[0]),
                 error_message=_NO_AUTHORIZER[1], matching_acls=())
            for _ in request.filters))
    if not _cluster_allowed(broker, ctx, Operation.ALTER):
        return make(mod.DeleteAclsResponse, throttle_time=0, filter_results=tuple(
            make(mod.DeleteAclsFilterResult, error_code=ErrorCode.cluster_authorization_failed,
                 error_message="Alter on the cluster is needed", matching_acls=())
            for _ in request.filters))
    deleted = broker.security.authorizer.delete([_filter(f) for f in request.filters])
    for gone in deleted:
        for binding in gone:
            log.info("ACL deleted: %s, by %s", binding, requester(ctx))
    return make(mod.DeleteAclsResponse, throttle_time=0, filter_results=tuple(
        make(mod.DeleteAclsFilterResult, error_code=0, error_message=None, matching_acls=tuple(
            make(mod.DeleteAclsMatchingAcl, error_code=0, error_message=None,
                 resource_type=int(b.resource_type), resource_name=b.resource_name,
                 pattern_type=int(b.pattern_type), principal=b.principal, host=b.host,
                 operation=int(b.operation), permission_type=int(b.permission))
            for b in gone)) for gone in deleted))
