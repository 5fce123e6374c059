"""Runnable examples: ``python -m oncelog.examples.purchases --help``."""
