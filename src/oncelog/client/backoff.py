"""How long to wait before trying again (Kafka's ExponentialBackoff, KIP-580).

The n-th retry (``attempts`` = n - 1, so the first retry passes 0) waits
``initial * multiplier ** attempts``, at most ``maximum``, times a random factor in
[1 - jitter, 1 + jitter]: clients that failed together (a broker restart) do not all come back
in the same millisecond. When ``maximum`` is not above ``initial`` the wait is simply
``initial``, as in Kafka (retry.backoff.max.ms below retry.backoff.ms turns the growth off).

Every retry in the client takes its wait from here: retry.backoff.ms / retry.backoff.max.ms
for requests (metadata, produce, coordinators, list offsets, admin calls) and
reconnect.backoff.ms / reconnect.backoff.max.ms for connections.
"""

from __future__ import annotations

import math
import random

from .config import ClientConfig

RETRY_BACKOFF_JITTER = 0.2  # Kafka's CommonClientConfigs.RETRY_BACKOFF_JITTER
RETRY_BACKOFF_EXP_BASE = 2


class ExponentialBackoff:
    __slots__ = ("_exp_max", "initial_ms", "jitter", "max_ms", "multiplier")

    def __init__(self, initial_ms: float, multiplier: float, max_ms: float,
                 jitter: float) -> None:
        self.initial_ms = initial_ms
        self.multiplier = multiplier
        self.max_ms = max_ms
        self.jitter = jitter
        # The exponent at which the cap is reached; 0 turns the growth (and the jitter) off.
        self._exp_max = (math.log(max_ms / max(initial_ms, 1)) / math.log(multiplier)
                         if max_ms > initial_ms else 0.0)

    def backoff_ms(self, attempts: int) -> float:
        if self._exp_max == 0:
            return self.initial_ms
        term = self.initial_ms * self.multiplier ** min(max(attempts, 0), self._exp_max)
        factor = random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter > 0 else 1.0
        return min(term * factor, self.max_ms)

    def backoff(self, attempts: int) -> float:
        """The wait in seconds."""
        return self.backoff_ms(attempts) / 1000


def retry_backoff(config: ClientConfig) -> ExponentialBackoff:
    return ExponentialBackoff(config.retry_backoff_ms, RETRY_BACKOFF_EXP_BASE,
                              config.retry_backoff_max_ms, RETRY_BACKOFF_JITTER)


def reconnect_backoff(config: ClientConfig) -> ExponentialBackoff:
    return ExponentialBackoff(config.reconnect_backoff_ms, RETRY_BACKOFF_EXP_BASE,
                              config.reconnect_backoff_max_ms, RETRY_BACKOFF_JITTER)
