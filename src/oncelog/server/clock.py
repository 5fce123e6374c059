"""Wall-clock milliseconds, the one time source of the broker (sans-IO cores take it as input)."""

import time


def now_ms() -> int:
    return int(time.time() * 1000)
