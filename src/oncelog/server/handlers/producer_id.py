"""InitProducerId without a transactional id: a fresh producer id, epoch 0 (with one, the
transaction coordinator answers: handlers/txn.py).

spec 000, "Client-Broker request handling", step 2: assign a new PID. An idempotent producer
that asks again (KIP-360 sends its current id and epoch) also gets a new id, as Kafka does for
non-transactional producers: its old sequence state is simply abandoned.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ..context import RequestContext
from ..ports import TxnApiPort
from . import acl
from .txn import handle_init_producer_id_transactional


async def handle_init_producer_id(broker: TxnApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.INIT_PRODUCER_ID, ctx.version)
    if request.transactional_id is not None:
        return await handle_init_producer_id_transactional(broker, ctx, request)
    if not acl.cluster(broker, ctx, acl.Op.IDEMPOTENT_WRITE):
        return make(mod.InitProducerIdResponse, throttle_time=0,
                    error_code=ErrorCode.cluster_authorization_failed, producer_id=-1,
                    producer_epoch=-1)
    try:
        pid = broker.producer_ids.next_producer_id()
    except OSError:
        return make(mod.InitProducerIdResponse, throttle_time=0,
                    error_code=ErrorCode.kafka_storage_error, producer_id=-1,
                    producer_epoch=-1)
    return make(mod.InitProducerIdResponse, throttle_time=0, error_code=0, producer_id=pid,
                producer_epoch=0)
