"""ACLs and the authorizer (Kafka's AclAuthorizer / StandardAuthorizer semantics), sans IO
except for the file they are kept in.

A binding says: principal P, from host H, may (ALLOW) or may not (DENY) do operation O on
resources of type T whose name matches N (LITERAL: equal, or ``*`` for all; PREFIXED: starts
with N). A request is allowed when no DENY binding matches and an ALLOW binding matches (one
for the operation or for one that implies it: Read/Write/Delete/Alter imply Describe, Write on a
topic implies IdempotentWrite on the cluster (KIP-679)); super users are always allowed; when
no binding at all names the resource, ``allow.everyone.if.no.acl.found`` decides.

The bindings are kept in ``acls.json`` in the data directory, rewritten atomically (temporary
file, fsync, rename) on every change.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

ACL_FILE = "acls.json"
WILDCARD = "*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15  # KIP-939


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
# An ALLOW for the key also allows these (Kafka's implied operations).
_IMPLIED_BY: dict[Operation, set[Operation]] = {
    Operation.DESCRIBE: {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER},
    Operation.DESCRIBE_CONFIGS: {Operation.ALTER_CONFIGS},
}


# Kafka's AclEntry.supportedOperations: the operations a resource type's authorized
# operations (KIP-430) are drawn from (Kafka 4's table: groups have configs since KIP-848).
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE,
                         Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE,
                         Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION,
                           Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                           Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}


def operations_from_bit_field(bits: int) -> frozenset[Operation] | None:
    """A KIP-430 answer as operations; None when the broker omitted them (Int.MinValue)."""
    if bits == -(2**31):
        return None
    return frozenset(op for op in Operation if op > Operation.ALL and bits & (1 << int(op)))


def parse_name(enum_cls, text: str):
    """Kafka's spelling (``TransactionalId``, ``IdempotentWrite``, ``PREFIXED``) to a member."""
    key = "".join(ch for ch in text if ch.isalnum()).lower()
    for member in enum_cls:
        if member.name.replace("_", "").lower() == key:
            return member
    raise ValueError(f"unknown {enum_cls.__name__} {text!r}; one of "
                     + ", ".join(display(m) for m in enum_cls if m.name not in ("UNKNOWN",)))


def display(member) -> str:
    """Kafka's display name: ``TransactionalId``, ``IdempotentWrite``, ``Prefixed``."""
    return "".join(part.capitalize() for part in member.name.split("_"))


@dataclass(frozen=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def __str__(self) -> str:
        # What error messages show (the dataclass repr is Python's, not the user's words).
        return (f"{self.principal} {display(self.permission)} {display(self.operation)} on "
                f"{display(self.resource_type)} {self.resource_name!r} "
                f"({display(self.pattern_type)}, host {self.host})")

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.resource_name in (name, WILDCARD)
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return False

    def to_json(self) -> dict:
        return {k: (v.name if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> AclBinding:
        return cls(ResourceType[d["resource_type"]], d["resource_name"],
                   PatternType[d["pattern_type"]], d["principal"], d["host"],
                   Operation[d["operation"]], Permission[d["permission"]])


@dataclass(frozen=True)
class AclFilter:
    """DescribeAcls / DeleteAcls filters: ANY (or None) matches everything; pattern MATCH
    matches the bindings that would apply to the named resource."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and b.resource_type != self.resource_type:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is not None and not b.matches_resource(b.resource_type,
                                                                         self.resource_name):
                return False
        else:
            if self.pattern_type != PatternType.ANY and b.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and b.resource_name != self.resource_name:
                return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.operation != Operation.ANY and b.operation != self.operation:
            return False
        return self.permission == Permission.ANY or b.permission == self.permission


class AclStoreError(ValueError):
    pass


class Authorizer:
    """``enabled`` False (no ``--security-protocol``): everything is allowed."""

    def __init__(self, data_dir: str | Path | None, *, enabled: bool,
                 super_users: Iterable[str] = (), allow_if_no_acl: bool = True) -> None:
        self.enabled = enabled
        self.super_users = set(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self.path = Path(data_dir) / ACL_FILE if data_dir is not None else None
        self.bindings: list[AclBinding] = []
        if self.path is not None and self.path.exists():
            try:
                self.bindings = [AclBinding.from_json(d)
                                 for d in json.loads(self.path.read_text())]
            except (ValueError, KeyError, TypeError) as exc:
                raise AclStoreError(f"{self.path} is damaged: {exc}") from None

    # -- decisions ----------------------------------------------------------------------------

    def authorize(self, principal: str, host: str, operation: Operation,
                  resource_type: ResourceType, name: str) -> bool:
        if not self.enabled or principal in self.super_users:
            return True
        if resource_type == ResourceType.CLUSTER:
            name = CLUSTER_NAME
        applicable = [b for b in self.bindings if b.matches_resource(resource_type, name)
                      or (resource_type == ResourceType.CLUSTER
                          and b.resource_type == ResourceType.CLUSTER)]
        mine = [b for b in applicable if b.principal in (principal, "User:*")
                and b.host in (host, WILDCARD)]
        for b in mine:
            if b.permission == Permission.DENY and b.operation in (operation, Operation.ALL):
                return False
        allowing = {operation, Operation.ALL} | _IMPLIED_BY.get(operation, set())
        if any(b.permission == Permission.ALLOW and b.operation in allowing for b in mine):
            return True
        if operation == Operation.IDEMPOTENT_WRITE and resource_type == ResourceType.CLUSTER \
                and self.any_allowed(principal, host, Operation.WRITE, ResourceType.TOPIC):
            return True  # KIP-679: Write on any topic implies IdempotentWrite
        return not applicable and self.allow_if_no_acl

    def any_allowed(self, principal: str, host: str, operation: Operation,
                    resource_type: ResourceType) -> bool:
        """Whether some resource of the type is allowed (KIP-679's idempotent write)."""
        if not self.enabled or principal in self.super_users:
            return True
        mine = [b for b in self.bindings if b.resource_type == resource_type
                and b.principal in (principal, "User:*") and b.host in (host, WILDCARD)]
        return any(b.permission == Permission.ALLOW
                   and b.operation in (operation, Operation.ALL) for b in mine)

    # -- management ---------------------------------------------------------------------------

    def add(self, bindings: Iterable[AclBinding]) -> None:
        for b in bindings:
            if b not in self.bindings:
                self.bindings.append(b)
        self._save()

    def describe(self, f: AclFilter) -> list[AclBinding]:
        return [b for b in self.bindings if f.matches(b)]

    def delete(self, filters: Iterable[AclFilter]) -> list[list[AclBinding]]:
        out = []
        for f in filters:
            gone = [b for b in self.bindings if f.matches(b)]
            self.bindings = [b for b in self.bindings if b not in gone]
            out.append(gone)
        self._save()
        return out

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump([b.to_json() for b in self.bindings], f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
