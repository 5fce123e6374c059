"""A broker without SASL has no authorizer (every request is allowed), so, as Kafka without an
authorizer, it refuses to manage ACLs (SECURITY_DISABLED) instead of storing ACLs that nothing
would enforce (librdkafka's 0109/0115/0119 denied User:* and expected a refusal)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AclBinding as CAclBinding
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
)
from confluent_kafka.admin import ResourceType as CResourceType

from oncelog import Admin
from oncelog.errors import SecurityDisabledError
from oncelog.security.acls import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)


def test_acl_requests_are_refused_without_an_authorizer(embedded_broker):
    bootstrap = embedded_broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deny = CAclBinding(CResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:*", "*",
                       AclOperation.WRITE, AclPermissionType.DENY)
    for f in admin.create_acls([deny]).values():
        with pytest.raises(KafkaException) as refused:
            f.result(10)
        assert refused.value.args[0].code() == CKError.SECURITY_DISABLED
    any_acl = AclBindingFilter(CResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                               AclOperation.ANY, AclPermissionType.ANY)
    for f in admin.delete_acls([any_acl]).values():
        with pytest.raises(KafkaException) as refused:
            f.result(10)
        assert refused.value.args[0].code() == CKError.SECURITY_DISABLED
    # (librdkafka's describe_acls answers [] for a refused DescribeAcls; ours raises, below.)

    with Admin(bootstrap_servers=bootstrap) as ours:
        with pytest.raises(SecurityDisabledError):
            ours.create_acls([AclBinding(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:*",
                                         "*", Operation.WRITE, Permission.DENY)])
        with pytest.raises(SecurityDisabledError):
            ours.describe_acls()
        with pytest.raises(SecurityDisabledError):
            ours.delete_acls([AclFilter()])
