"""Kafka's command-line tools run side by side against the real Kafka and an oncelog broker, and
their outputs compared after normalising what legitimately differs between two clusters.

    pair = ToolPair(kafka_tools, apache_kafka, oncelog.bootstrap_servers)
    k, o = pair.run("kafka-topics", "--bootstrap-server", BS, "--describe", "--topic", t)
    assert_same_output(k, o)                         # exit code, normalised stdout
    assert_same_table(k.stdout, o.stdout)            # header + rows of a column table

``BS`` in an argument (or in ``input``) stands for the side's bootstrap address. Normalising
replaces, on both sides alike: the bootstrap address (host:port) of each cluster, topic ids,
consumer/member ids, client ids the tools make up (console-consumer-NNNN, perf-consumer-NNNN),
record timestamps and dates, and Kafka's lines that only say an option is deprecated.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from oncelog.harness.apache_kafka import KafkaTools, ToolResult

BS = "{BS}"

# Kafka's Uuid.toString: 16 bytes, URL-safe base64 without padding (22 characters)
_TOPIC_ID = re.compile(r"(TopicId: ?)[A-Za-z0-9_-]{22}")
_MEMBER_ID = re.compile(r"\b([\w.-]*?-)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_TOOL_CLIENT_ID = re.compile(r"\b(console-consumer|perf-consumer|consumer-[\w.-]+?)-\d+\b")
_HOST_PORT = re.compile(r"/?\b\d{1,3}(\.\d{1,3}){3}:\d{2,5}\b")
_HOST = re.compile(r"/\d{1,3}(\.\d{1,3}){3}\b")
_CREATE_TIME = re.compile(r"\b(CreateTime|LogAppendTime):\d+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}[:.]\d{3}")
_DEPRECATED = re.compile(r"^(Warning: |Option )?.*(is|has been) deprecated.*$\n?", re.MULTILINE)


def normalise(text: str) -> str:
    """``text`` with the values that differ between any two clusters replaced by placeholders."""
    text = _DEPRECATED.sub("", text)
    text = _TOPIC_ID.sub(r"\1<topic-id>", text)
    text = _MEMBER_ID.sub("<member-id>", text)
    text = _TOOL_CLIENT_ID.sub(r"\1-<n>", text)
    text = _HOST_PORT.sub("<host:port>", text)
    text = _HOST.sub("/<host>", text)
    text = _CREATE_TIME.sub(r"\1:<ts>", text)
    return _DATE.sub("<date>", text)


@dataclass
class ToolPair:
    """One command, the same arguments, against both clusters."""

    tools: KafkaTools
    kafka: str
    oncelog: str

    def run(self, tool: str, *args: str, input: str | None = None, timeout: float = 120.0
            ) -> tuple[ToolResult, ToolResult]:
        out = []
        for bootstrap in (self.kafka, self.oncelog):
            out.append(self.tools.run(tool, *(a.replace(BS, bootstrap) for a in args),
                                      input=input.replace(BS, bootstrap) if input else input,
                                      timeout=timeout))
        return out[0], out[1]

    def settled(self, tool: str, *args: str,
                agree: Callable[[ToolResult, ToolResult], bool] | None = None,
                timeout: float = 30.0) -> tuple[ToolResult, ToolResult]:
        """``run`` again until both sides ``agree`` (default: the same exit code and normalised
        stdout), or ``timeout`` passes; the last answers. After a change, Kafka's broker
        applies its controller's record (new partitions, configs, credentials) a moment after
        the admin call returned, where oncelog has already: a real difference stays, and the
        comparison that follows fails on it."""
        agree = agree or (lambda k, o: (k.returncode, normalise(k.stdout))
                          == (o.returncode, normalise(o.stdout)))
        deadline = time.monotonic() + timeout
        while True:
            k, o = self.run(tool, *args)
            if agree(k, o) or time.monotonic() > deadline:
                return k, o
            time.sleep(0.1)

    def same(self, tool: str, *args: str, input: str | None = None, stderr: bool = False
             ) -> tuple[ToolResult, ToolResult]:
        """``run``, then ``assert_same_output``."""
        k, o = self.run(tool, *args, input=input)
        assert_same_output(k, o, stderr=stderr)
        return k, o


def assert_same_output(k: ToolResult, o: ToolResult, *, stderr: bool = False) -> None:
    """Same exit code and the same normalised stdout (and stderr, if asked)."""
    where = f"{k.tool} {' '.join(k.args)}"
    assert (o.returncode, normalise(o.stdout)) == (k.returncode, normalise(k.stdout)), (
        f"{where}\n--- Kafka ({k.returncode}):\n{k.stdout}{k.stderr}\n"
        f"--- oncelog ({o.returncode}):\n{o.stdout}{o.stderr}")
    if stderr:
        assert normalise(o.stderr) == normalise(k.stderr), (
            f"{where}\n--- Kafka stderr:\n{k.stderr}\n--- oncelog stderr:\n{o.stderr}")


# -- column tables (kafka-consumer-groups) --------------------------------------------------------

# Headers of more than one word, and values Kafka prints with spaces inside a column
_MULTI_WORD_HEADERS = ("COORDINATOR (ID)",)
_SPACED_VALUES = re.compile(r"(<host:port>|\S+:\d+)\s+\((-?\d+)\)")  # "host:port  (1)"


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the first column table in ``text`` (after ``normalise``): the header
    is the first line whose words are all in capitals; each row is split on whitespace."""
    lines = [line for line in normalise(text).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        words = line.split()
        if words and all(w == w.upper() and any(c.isalpha() for c in w) for w in words):
            header_line = line
            for multi in _MULTI_WORD_HEADERS:
                header_line = header_line.replace(multi, multi.replace(" ", "_"))
            header = [h.replace("_", " ") if "(" in h else h for h in header_line.split()]
            rows = [_SPACED_VALUES.sub(r"\1(\2)", row).split() for row in lines[i + 1:]]
            return header, rows
    raise AssertionError(f"no table in:\n{text}")


def assert_same_table(k_text: str, o_text: str, *, sort: bool = True) -> list[dict[str, str]]:
    """The same header and the same rows (sorted unless ``sort`` is False); the rows as dicts."""
    k_header, k_rows = table(k_text)
    o_header, o_rows = table(o_text)
    assert o_header == k_header, f"header:\nKafka:   {k_header}\noncelog: {o_header}"
    if sort:
        k_rows, o_rows = sorted(k_rows), sorted(o_rows)
    assert o_rows == k_rows, (f"rows under {k_header}:\nKafka:\n{k_text}\noncelog:\n{o_text}")
    return [dict(zip(k_header, row, strict=False)) for row in k_rows]


# -- "Key: value<TAB>Key: value" lines (kafka-topics --describe) ----------------------------------

def fields(line: str) -> dict[str, str]:
    """``Topic: t<TAB>Partition: 0<TAB>...`` as a dict (values stripped)."""
    out = {}
    for part in line.strip("\n").split("\t"):
        if not part.strip():
            continue
        key, _, value = part.partition(":")
        out[key.strip()] = value.strip()
    return out


def described(text: str) -> list[dict[str, str]]:
    """Every line of a ``kafka-topics --describe`` output as ``fields``."""
    return [fields(line) for line in normalise(text).splitlines() if line.strip()]


def without(items: Iterable[str], drop: Iterable[str]) -> list[str]:
    gone = set(drop)
    return [i for i in items if i not in gone]
