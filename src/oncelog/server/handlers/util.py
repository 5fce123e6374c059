"""Small helpers shared by the handlers."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..context import RequestContext


def error_code(error: ErrorCode | None) -> ErrorCode:
    """The code a response carries for an error (None: no error, ``ErrorCode.none``)."""
    return ErrorCode.none if error is None else error


def requester(ctx: RequestContext) -> str:
    """Who asked, for the broker's log of changes (topics, configs, ACLs): the principal and
    its address, as Kafka's request log names them."""
    if ctx.session is None:
        return "the broker itself"
    return f"{ctx.session.principal} from {ctx.client_address}"
