"""The options of Spark's Kafka source, parsed (no Spark needed: testable on its own).

- ``kafka.bootstrap.servers`` (required), ``kafka.<client setting>`` for our client (Kafka's
  dotted names, e.g. ``kafka.security.protocol``); ``kafka.isolation.level`` defaults to
  read_committed here (Spark's Kafka source reads uncommitted by default).
- exactly one of ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regex),
  ``assign`` (JSON ``{"topic": [0, 1]}``).
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON
  ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest). ``endingOffsets`` is for batch
  queries only.
- ``maxOffsetsPerTrigger``, ``failOnDataLoss`` (default true), ``includeHeaders``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EARLIEST, LATEST = -2, -1


class OptionError(ValueError):
    pass


@dataclass
class SourceOptions:
    bootstrap_servers: str
    subscribe: list[str] | None = None
    pattern: re.Pattern | None = None
    assign: dict[str, list[int]] | None = None
    # None: not given (Spark's defaults: latest for streams, earliest for batch reads)
    starting: str | dict[str, dict[int, int]] | None = None
    ending: str | dict[str, dict[int, int]] = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    client: dict[str, str] = field(default_factory=dict)

    def client_config(self) -> dict[str, str]:
        """Settings for our client (dotted Kafka names)."""
        out = {"bootstrap.servers": self.bootstrap_servers,
               "isolation.level": "read_committed"}
        out.update(self.client)
        return out


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "false"):
        return v == "true"
    raise OptionError(f"option {name} must be true or false, not {value!r}")


def _offsets(name: str, value: str, allow_latest: bool = True
             ) -> str | dict[str, dict[int, int]]:
    v = value.strip()
    if v.lower() in ("earliest", "latest"):
        return v.lower()
    try:
        parsed = json.loads(v)
        out = {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"option {name}: expected earliest, latest or JSON like "
                          f'{{"topic":{{"0":23,"1":-2}}}}, got {value!r}') from None
    for t, parts in out.items():
        for p, o in parts.items():
            if o < EARLIEST or (o == LATEST and not allow_latest):
                raise OptionError(f"option {name}: bad offset {o} for {t}-{p}")
    return out


def parse(options: Mapping[str, Any]) -> SourceOptions:
    opts = {k.lower(): str(v) for k, v in options.items()}
    bootstrap = opts.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError("option kafka.bootstrap.servers is required")
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(given) != 1:
        raise OptionError("give exactly one of the options subscribe, subscribePattern, assign")
    o = SourceOptions(bootstrap)
    if "subscribe" in opts:
        o.subscribe = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
        if not o.subscribe:
            raise OptionError("option subscribe names no topic")
    elif "subscribepattern" in opts:
        try:
            o.pattern = re.compile(opts["subscribepattern"])
        except re.error as exc:
            raise OptionError(f"option subscribePattern: {exc}") from None
    else:
        try:
            parsed = json.loads(opts["assign"])
            o.assign = {str(t): [int(p) for p in ps] for t, ps in parsed.items()}
        except (ValueError, AttributeError, TypeError):
            raise OptionError('option assign: expected JSON like {"topic":[0,1]}, got '
                              f"{opts['assign']!r}") from None
    if "startingoffsets" in opts:
        o.starting = _offsets("startingOffsets", opts["startingoffsets"])
    if "endingoffsets" in opts:
        o.ending = _offsets("endingOffsets", opts["endingoffsets"])
        if o.ending == "earliest":
            raise OptionError("option endingOffsets cannot be earliest")
    if "maxoffsetspertrigger" in opts:
        try:
            o.max_offsets_per_trigger = int(opts["maxoffsetspertrigger"])
        except ValueError:
            raise OptionError("option maxOffsetsPerTrigger must be a number") from None
        if o.max_offsets_per_trigger <= 0:
            raise OptionError("option maxOffsetsPerTrigger must be positive")
    if "failondataloss" in opts:
        o.fail_on_data_loss = _bool("failOnDataLoss", opts["failondataloss"])
    if "includeheaders" in opts:
        o.include_headers = _bool("includeHeaders", opts["includeheaders"])
    for k, v in options.items():
        if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers":
            o.client[k[len("kafka."):].lower()] = str(v)
    return o
