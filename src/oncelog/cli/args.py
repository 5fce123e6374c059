"""Argument types the command-line tools share (``oncelog``, ``oncelog verify``,
``oncelog cluster``): one place, so every ``--set`` reads the same way."""

from __future__ import annotations

import argparse


class UsageError(ValueError):
    """Flags a command refuses together (or a flag one needs and lacks), as Kafka's tools'
    printUsageAndThrow: the command's usage and the message, exit status 2."""


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (as Kafka's tools take ``--add-config`` and ``--producer-property``)."""
    key, value = property_value(text)
    return key, value.strip()


def property_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` as Kafka's console tools take ``--property``: the value as given, spaces
    and all (a separator may be one)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), value
