"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): Describe / Alter on
the cluster; the credentials are the broker's ``security.credentials`` (security/
credential_store.py), kept in the data directory or, in a cluster, in ZooKeeper. Their checks
and answers are Kafka's (ZkAdminManager)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ...security.scram import MECHANISM_CODES, Deletion, Upsertion
from ..context import RequestContext
from ..ports import SecurityApiPort
from . import acl
from .util import error_code


async def handle_describe_user_scram_credentials(broker: SecurityApiPort, ctx: RequestContext,
                                                 request: Any) -> Any:
    mod = response_module(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ctx.version)
    names = [u.name for u in request.users] if request.users else None
    if not acl.cluster(broker, ctx, acl.Op.DESCRIBE):
        # Kafka's error response: the request's error, no result.
        return make(mod.DescribeUserScramCredentialsResponse, throttle_time=0,
                    error_code=ErrorCode.cluster_authorization_failed,
                    error_message="Describe on the cluster is needed", results=())
    refused: dict[str, tuple[ErrorCode, str]] = {}
    if names is not None:
        for name, count in Counter(names).items():
            if not name:
                refused[name] = (ErrorCode.resource_not_found, "Username must not be empty")
            elif count > 1:
                refused[name] = (ErrorCode.duplicate_resource, (
                    "Cannot describe SCRAM credentials for the same user twice in a single "
                    f"request: {name}"))
    asked = None if names is None else [n for n in dict.fromkeys(names) if n not in refused]
    found = await asyncio.to_thread(broker.security.credentials.describe, asked)
    results = []
    for name in (found if names is None else dict.fromkeys(names)):
        if name in refused:
            err, message = refused[name]
            results.append(make(mod.DescribeUserScramCredentialsResult, user=name,
                                error_code=error_code(err), error_message=message,
                                credential_infos=()))
            continue
        infos = found[name]
        if infos is None:
            results.append(make(
                mod.DescribeUserScramCredentialsResult, user=name,
                error_code=ErrorCode.resource_not_found,
                error_message=f"Attempt to describe a user credential that does not exist: "
                f"{name}", credential_infos=()))
            continue
        results.append(make(mod.DescribeUserScramCredentialsResult, user=name, error_code=0,
                            error_message=None, credential_infos=tuple(
                                make(mod.CredentialInfo, mechanism=MECHANISM_CODES[m],
                                     iterations=i) for m, i in sorted(infos.items()))))
    return make(mod.DescribeUserScramCredentialsResponse, throttle_time=0, error_code=0,
                error_message=None, results=tuple(results))


async def handle_alter_user_scram_credentials(broker: SecurityApiPort, ctx: RequestContext,
                                              request: Any) -> Any:
    mod = response_module(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, ctx.version)
    if not acl.cluster(broker, ctx, acl.Op.ALTER):
        # Kafka's error response: every user named, sorted, with the error.
        users = sorted({x.name for x in (*request.deletions, *request.upsertions)})
        return make(mod.AlterUserScramCredentialsResponse, throttle_time=0, results=tuple(
            make(mod.AlterUserScramCredentialsResult, user=u,
                 error_code=ErrorCode.cluster_authorization_failed,
                 error_message="Alter on the cluster is needed") for u in users))
    ups = [Upsertion(u.name, int(u.mechanism), int(u.iterations), bytes(u.salt),
                     bytes(u.salted_password)) for u in request.upsertions]
    dels = [Deletion(d.name, int(d.mechanism)) for d in request.deletions]
    outcome = await asyncio.to_thread(broker.security.credentials.alter, ups, dels)
    return make(mod.AlterUserScramCredentialsResponse, throttle_time=0, results=tuple(
        make(mod.AlterUserScramCredentialsResult, user=user,
             error_code=error_code(None if result is None else result[0]),
             error_message=None if result is None else result[1])
        for user, result in outcome.items()))
