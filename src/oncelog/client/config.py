"""Client configuration under Kafka's own names, with the Java client's defaults.

Users pass either keyword arguments with dots as underscores (``linger_ms=10``) or, as the
first positional argument, a dict of the dotted names (``{"linger.ms": 10}``), as they would
to the Java client or librdkafka. Both may be combined; keyword arguments win. String values
("10", "true") are converted, since configs often come from property files.

Each client kind has its own table so that a key meant for another client (``acks`` given to a
consumer) is rejected as clearly as a typo.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..records import Compression

MAX_INT = 2**31 - 1


def _int(value: Any) -> int:
    if isinstance(value, bool):  # a bool is an int to Python, not to a config file
        raise ValueError(f"expected an integer, got {value!r}")  # noqa: TRY004 (reported as a config error)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ValueError(f"expected an integer, got {value!r}")


def _non_negative_int(value: Any) -> int:
    n = _int(value)
    if n < 0:
        raise ValueError(f"must be >= 0, got {n}")
    return n


def _positive_int(value: Any) -> int:
    n = _int(value)
    if n < 1:
        raise ValueError(f"must be >= 1, got {n}")
    return n


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"expected true or false, got {value!r}")


def _servers(value: Any) -> list[tuple[str, int]]:
    """"host:port,host:port" or a list of "host:port" strings."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected host:port, got {item!r}")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("needs at least one host:port")
    return out


def _acks(value: Any) -> int:
    """"all" and -1 mean the same thing to the broker: the full ISR."""
    text = str(value).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"expected all, -1, 0 or 1, got {value!r}")


def _compression(value: Any) -> Compression:
    if isinstance(value, Compression):
        return value
    return Compression.from_name(str(value))


def _choice(*choices: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return convert


def _upper_choice(*choices: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        text = str(value).strip().upper().replace("_", "-") if "SCRAM" in str(value).upper() \
            else str(value).strip().upper()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return convert


def _str(value: Any) -> str:
    return str(value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _assignors(value: Any) -> list[str]:
    """Kafka's names ("range", "roundrobin", "cooperative-sticky"; also the Java class names),
    a list or a comma-separated string, in order of preference."""
    known = {"range": "range", "roundrobin": "roundrobin",
             "cooperative-sticky": "cooperative-sticky", "cooperativesticky": "cooperative-sticky"}
    names = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for name in names:
        short = str(name).strip().rsplit(".", 1)[-1].lower().removesuffix("assignor")
        if short not in known:
            raise ValueError(f"unsupported partition assignment strategy {name!r} "
                             "(oncelog has range, roundrobin and cooperative-sticky)")
        out.append(known[short])
    if not out:
        raise ValueError("at least one partition assignment strategy is needed")
    return out


@dataclass(frozen=True)
class Key:
    name: str  # Kafka's dotted name
    default: Any
    convert: Callable[[Any], Any]
    required: bool = False

    @property
    def attr(self) -> str:
        return self.name.replace(".", "_")


def _table(*keys: Key) -> dict[str, Key]:
    return {k.name: k for k in keys}


_COMMON = (
    Key("bootstrap.servers", None, _servers, required=True),
    Key("client.id", "", _str),
    Key("request.timeout.ms", 30000, _positive_int),
    Key("retry.backoff.ms", 100, _non_negative_int),
    Key("retry.backoff.max.ms", 1000, _non_negative_int),
    Key("reconnect.backoff.ms", 50, _non_negative_int),
    Key("reconnect.backoff.max.ms", 1000, _non_negative_int),
    Key("socket.connection.setup.timeout.ms", 10000, _positive_int),
    Key("metadata.max.age.ms", 300000, _positive_int),
    # SASL (the broker's SASL_PLAINTEXT listener): kafka-python's and librdkafka's names.
    Key("security.protocol", "PLAINTEXT", _upper_choice("PLAINTEXT", "SASL_PLAINTEXT")),
    Key("sasl.mechanism", "PLAIN", _upper_choice("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
    Key("sasl.plain.username", None, _optional_str),
    Key("sasl.plain.password", None, _optional_str),
)

PRODUCER_KEYS = _table(
    *_COMMON,
    Key("acks", -1, _acks),
    # Kafka 4.0 raised the Java default from 0 to 5 ms (KIP-1030): better batching, same latency
    # in practice.
    Key("linger.ms", 5, _non_negative_int),
    Key("batch.size", 16384, _non_negative_int),
    Key("compression.type", Compression.NONE, _compression),
    Key("retries", MAX_INT, _non_negative_int),
    Key("delivery.timeout.ms", 120000, _positive_int),
    Key("max.in.flight.requests.per.connection", 5, _positive_int),
    Key("enable.idempotence", True, _bool),
    Key("max.request.size", 1048576, _positive_int),
    Key("buffer.memory", 33554432, _positive_int),
    Key("max.block.ms", 60000, _non_negative_int),
    Key("transactional.id", None, _optional_str),
    Key("transaction.timeout.ms", 60000, _positive_int),
    # KIP-939: take part in two-phase commit (the broker must allow it); such transactions
    # never time out, so transaction.timeout.ms may not be set with it.
    Key("transaction.two.phase.commit.enable", False, _bool),
)

CONSUMER_KEYS = _table(
    *_COMMON,
    Key("isolation.level", "read_uncommitted", _choice("read_uncommitted", "read_committed")),
    Key("auto.offset.reset", "latest", _choice("latest", "earliest", "none")),
    Key("fetch.max.wait.ms", 500, _non_negative_int),
    Key("fetch.min.bytes", 1, _non_negative_int),
    Key("fetch.max.bytes", 52428800, _non_negative_int),
    Key("max.partition.fetch.bytes", 1048576, _non_negative_int),
    Key("check.crcs", True, _bool),
    Key("max.poll.records", 500, _positive_int),
    # how long iterating a Consumer (``for record in consumer``) waits for a record before the
    # loop ends; -1: forever (the old Scala consumer's consumer.timeout.ms, kafka-python's
    # consumer_timeout_ms)
    Key("consumer.timeout.ms", -1, _int),
    Key("default.api.timeout.ms", 60000, _positive_int),
    Key("group.id", None, _optional_str),
    Key("group.instance.id", None, _optional_str),
    Key("enable.auto.commit", True, _bool),
    Key("auto.commit.interval.ms", 5000, _non_negative_int),
    Key("session.timeout.ms", 45000, _positive_int),
    Key("heartbeat.interval.ms", 3000, _positive_int),
    Key("max.poll.interval.ms", 300000, _positive_int),
    # The Java client's default: range, with cooperative-sticky for an upgrade to it.
    Key("partition.assignment.strategy", ["range", "cooperative-sticky"], _assignors),
)

ADMIN_KEYS = _table(
    *_COMMON,
    Key("retries", MAX_INT, _non_negative_int),
    Key("default.api.timeout.ms", 60000, _positive_int),
)


class ClientConfig:
    """Resolved configuration: ``config.linger_ms`` etc.; ``config.given`` names what the user set."""

    def __init__(self, kind: str, values: dict[str, Any], given: frozenset[str]) -> None:
        self.kind = kind
        self._values = values
        self.given = given

    def __getattr__(self, attr: str) -> Any:
        try:
            return self._values[attr]
        except KeyError:
            raise AttributeError(f"{self.kind} config has no {attr!r}") from None

    def __repr__(self) -> str:
        return f"ClientConfig({self.kind}, {self._values!r})"


def resolve(kind: str, keys: dict[str, Key], config: Mapping[str, Any] | None,
            kwargs: Mapping[str, Any]) -> ClientConfig:
    """Merge the dict (dotted names) and keyword arguments (underscored), check and convert."""
    by_attr = {k.attr: k for k in keys.values()}
    merged: dict[str, Any] = {}
    if config is not None:
        if not isinstance(config, Mapping):
            raise TypeError(f"{kind} config must be a dict of Kafka config names, "
                            f"got {type(config).__name__}")
        for name, value in config.items():
            key = keys.get(name) or by_attr.get(name)
            if key is None:
                raise ValueError(_unknown(kind, name, keys))
            merged[key.attr] = value
    for attr, value in kwargs.items():
        key = by_attr.get(attr)
        if key is None:
            raise ValueError(_unknown(kind, attr, keys))
        merged[attr] = value
    values: dict[str, Any] = {}
    for key in keys.values():
        if key.attr in merged:
            try:
                values[key.attr] = key.convert(merged[key.attr])
            except ValueError as exc:
                raise ValueError(f"invalid value for {kind} config {key.name!r}: {exc}") from None
        elif key.required:
            raise ValueError(f"{kind} config {key.name!r} is required")
        else:
            values[key.attr] = key.default
    return ClientConfig(kind, values, frozenset(merged))


def _unknown(kind: str, name: str, keys: dict[str, Key]) -> str:
    import difflib

    dotted = name.replace("_", ".")
    close = difflib.get_close_matches(dotted, list(keys), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} config {name!r}{hint}"


def producer_config(config: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> ClientConfig:
    cfg = resolve("producer", PRODUCER_KEYS, config, kwargs)
    given = cfg.given
    values = cfg._values
    # Idempotence needs acks=all, retries and at most 5 in flight (the broker remembers the last
    # five batches per producer). As in the Java client: an explicit conflict is an error, an
    # implicit default just yields to the user's explicit acks/retries/in-flight choice.
    conflicts = []
    if values["acks"] != -1:
        conflicts.append("acks must be all")
    if values["retries"] == 0:
        conflicts.append("retries must be > 0")
    if values["max_in_flight_requests_per_connection"] > 5:
        conflicts.append("max.in.flight.requests.per.connection must be <= 5")
    if values["transactional_id"] is not None:
        # Transactions need idempotence (spec 000, "Transactional Producer").
        if "enable_idempotence" in given and not values["enable_idempotence"]:
            raise ValueError("transactional.id requires enable.idempotence=true")
        if conflicts:
            raise ValueError("transactional.id conflicts with the configuration: "
                             + "; ".join(conflicts))
        values["enable_idempotence"] = True
    if values["transaction_two_phase_commit_enable"]:
        if values["transactional_id"] is None:
            raise ValueError("transaction.two.phase.commit.enable requires transactional.id")
        if "transaction_timeout_ms" in given:
            raise ValueError("transaction.timeout.ms cannot be set with "
                             "transaction.two.phase.commit.enable=true: such transactions "
                             "never time out (KIP-939)")
    if values["enable_idempotence"] and conflicts:
        if "enable_idempotence" in given:
            raise ValueError("enable.idempotence=true conflicts with the configuration: "
                             + "; ".join(conflicts))
        values["enable_idempotence"] = False
    if values["delivery_timeout_ms"] < values["linger_ms"] + values["request_timeout_ms"]:
        if "delivery_timeout_ms" in given:
            raise ValueError("delivery.timeout.ms must be >= linger.ms + request.timeout.ms")
        values["delivery_timeout_ms"] = values["linger_ms"] + values["request_timeout_ms"]
    return cfg


def consumer_config(config: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> ClientConfig:
    return resolve("consumer", CONSUMER_KEYS, config, kwargs)


def admin_config(config: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> ClientConfig:
    return resolve("admin", ADMIN_KEYS, config, kwargs)
