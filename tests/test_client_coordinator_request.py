"""The client's one backoff and its one coordinator-request loop, sans IO: a CoordinatorCall is
fed answers by hand and says what to send next or how long to wait."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oncelog.client.backoff import ExponentialBackoff
from oncelog.client.coordinator_request import (
    KEY_TYPE_GROUP,
    Action,
    BrokerVersions,
    CoordinatorCall,
    CoordinatorRequestHandler,
    Coordinators,
    Send,
)
from oncelog.client.errors import KafkaTimeoutError
from oncelog.errors import (
    ConcurrentTransactionsError,
    GroupAuthorizationFailedError,
    NetworkError,
    NotCoordinatorError,
    UnknownServerError,
)
from oncelog.protocol import ApiKey

NOW = 100.0


def test_the_backoff_doubles_with_jitter_up_to_its_maximum():
    b = ExponentialBackoff(100, 2, 1000, 0.2)
    for attempts, base in [(0, 100), (1, 200), (2, 400), (3, 800)]:
        waits = [b.backoff_ms(attempts) for _ in range(200)]
        assert all(0.8 * base <= w <= 1.2 * base for w in waits)
        assert len(set(waits)) > 1  # jittered: clients that failed together spread out
    assert all(800 <= b.backoff_ms(n) <= 1000 for n in (4, 10, 60) for _ in range(50))
    assert b.backoff(0) == pytest.approx(b.backoff_ms(0) / 1000, rel=0.5)


def test_a_maximum_not_above_the_initial_wait_turns_growth_and_jitter_off():
    b = ExponentialBackoff(100, 2, 50, 0.2)
    assert {b.backoff_ms(n) for n in range(10)} == {100}


class Handler(CoordinatorRequestHandler):
    """Answers by error code: what each code means is what the test set up."""

    api = ApiKey.OFFSET_FETCH
    key_type = KEY_TYPE_GROUP
    key = "g"

    def __init__(self) -> None:
        self.built = 0

    def create_request(self, broker: BrokerVersions) -> dict:
        self.built += 1
        return {"group_id": self.key}

    def handle_response(self, response) -> Action:
        code = response.error_code
        if code == NotCoordinatorError.code or code == ConcurrentTransactionsError.code:
            return self.retriable(code, "OffsetFetch")
        if code == UnknownServerError.code:
            raise UnknownServerError("boom")
        return Action.DONE


def _found(node: int, code: int = 0):
    return SimpleNamespace(coordinators=[SimpleNamespace(
        error_code=code, error_message=None, node_id=node, host=f"h{node}", port=9000 + node)])


def _call(coordinators: Coordinators | None = None, deadline: float = NOW + 10) -> CoordinatorCall:
    return CoordinatorCall(Handler(), deadline, ExponentialBackoff(100, 2, 1000, 0.2),
                           coordinators or Coordinators(), request_timeout_ms=30_000)


def _send(call: CoordinatorCall, now: float) -> Send:
    step = call.poll(now)
    assert isinstance(step, Send), step
    return step


def test_the_coordinator_is_found_then_asked_and_kept():
    coordinators = Coordinators()
    call = _call(coordinators)
    find = _send(call, NOW)
    assert (find.api, find.node) == (ApiKey.FIND_COORDINATOR, None)
    assert find.values(BrokerVersions()) == {"key": "g", "key_type": KEY_TYPE_GROUP,
                                             "coordinator_keys": ["g"]}
    assert call.poll(NOW) is None  # one request at a time
    call.on_response(find, _found(3), NOW)
    ask = _send(call, NOW)
    assert (ask.api, ask.node, ask.address) == (ApiKey.OFFSET_FETCH, 3, ("h3", 9003))
    assert ask.timeout_ms == 10_000  # what is left of the deadline, below request.timeout.ms
    call.on_response(ask, SimpleNamespace(error_code=0), NOW)
    assert call.done and call.result().error_code == 0

    again = _call(coordinators)  # the next call goes straight to the coordinator
    assert _send(again, NOW).node == 3


def test_a_busy_coordinator_is_asked_again_after_a_growing_backoff():
    call = _call()
    call.on_response(_send(call, NOW), _found(1), NOW)
    now, waits = NOW, []
    for _ in range(3):
        ask = _send(call, now)
        assert ask.node == 1  # busy is not moved: the coordinator is kept
        call.on_response(ask, SimpleNamespace(error_code=ConcurrentTransactionsError.code), now)
        wait = call.poll(now)
        assert isinstance(wait, float)
        waits.append(wait)
        now += wait
    assert 0.08 <= waits[0] <= 0.12 and 0.16 <= waits[1] <= 0.24 and 0.32 <= waits[2] <= 0.48
    call.on_response(_send(call, now), SimpleNamespace(error_code=0), now)
    assert call.done and call.error is None


@pytest.mark.parametrize("how", ["not coordinator", "unreachable"])
def test_a_moved_or_unreachable_coordinator_is_found_again(how):
    coordinators = Coordinators()
    call = _call(coordinators)
    call.on_response(_send(call, NOW), _found(1), NOW)
    ask = _send(call, NOW)
    if how == "unreachable":
        call.on_failure(ask, NetworkError("node 1 is not reachable"), NOW)
    else:
        call.on_response(ask, SimpleNamespace(error_code=NotCoordinatorError.code), NOW)
    assert coordinators.get(KEY_TYPE_GROUP, "g") is None
    now = NOW + call.poll(NOW)  # type: ignore[operator]
    find = _send(call, now)
    assert find.api == ApiKey.FIND_COORDINATOR
    call.on_response(find, _found(2), now)
    assert _send(call, now).node == 2


def test_the_deadline_ends_the_call_with_the_handlers_timeout_error():
    call = _call(deadline=NOW + 0.5)
    call.on_response(_send(call, NOW), _found(1), NOW)
    now = NOW
    while not call.done:
        step = call.poll(now)
        if isinstance(step, Send):
            call.on_response(step, SimpleNamespace(
                error_code=ConcurrentTransactionsError.code), now)
        elif isinstance(step, float):
            now += step
    assert now < NOW + 0.5  # a wait that would end past the deadline is not waited
    with pytest.raises(KafkaTimeoutError, match="OFFSET_FETCH did not complete in time"):
        call.result()


def test_errors_that_retrying_cannot_help_end_the_call():
    refused = _call()
    refused.on_response(_send(refused, NOW), _found(-1, GroupAuthorizationFailedError.code), NOW)
    with pytest.raises(GroupAuthorizationFailedError):
        refused.result()

    raised = _call()
    raised.on_response(_send(raised, NOW), _found(1), NOW)
    raised.on_response(_send(raised, NOW), SimpleNamespace(error_code=UnknownServerError.code),
                       NOW)
    with pytest.raises(UnknownServerError, match="boom"):
        raised.result()


def test_an_answer_to_an_abandoned_request_is_ignored():
    call = _call()
    find = _send(call, NOW)
    call.fail(KafkaTimeoutError("given up"))
    call.on_response(find, _found(1), NOW)
    with pytest.raises(KafkaTimeoutError, match="given up"):
        call.result()
