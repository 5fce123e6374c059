"""Key and value (de)serializers: kafka-python's ``key_serializer``/``value_serializer`` on the
Producer and ``key_deserializer``/``value_deserializer`` on the Consumer (or Kafka's dotted
names, ``key.serializer`` ..., in the config dict).

A (de)serializer is a callable taking the key or value, or an object with Kafka's
``serialize(topic, data)`` / ``deserialize(topic, data)`` method. A None key or value (no key;
a tombstone) is passed through as None without calling it, as Kafka's own serializers turn
null into null. A serializer's exception fails the ``send`` with SerializationError (Kafka's
SerializationException); a deserializer's fails the ``poll``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .errors import SerializationError

Serde = Callable[[Any], Any] | Any


def take(config: Mapping[str, Any] | None, kwargs: dict[str, Any], names: tuple[str, str]
         ) -> tuple[Mapping[str, Any] | None, list[Serde | None]]:
    """Remove the (de)serializer settings ``names`` (underscored) from ``config`` and
    ``kwargs``; the client config has no place for callables."""
    found: list[Serde | None] = []
    rest = dict(config) if config is not None else None
    for name in names:
        dotted = name.replace("_", ".")
        value = kwargs.pop(name, None)
        if rest is not None and dotted in rest:
            value = rest.pop(dotted) if value is None else value
        if value is not None and not callable(value) and \
                not callable(getattr(value, "serialize" if "deserial" not in name
                                     else "deserialize", None)):
            raise TypeError(f"{name} must be a callable (or have Kafka's "
                            f"{'deserialize' if 'deserial' in name else 'serialize'}"
                            f"(topic, data) method), not {type(value).__name__}")
        found.append(value)
    return rest, found


def apply(serde: Serde | None, topic: str, data: Any, what: str, method: str) -> Any:
    if serde is None or data is None:
        return data
    try:
        bound = getattr(serde, method, None)
        return bound(topic, data) if callable(bound) else serde(data)
    except Exception as exc:
        raise SerializationError(f"{what} of a record of topic {topic!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
