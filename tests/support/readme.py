"""Run the shell and Python blocks of a Markdown document as a reader would paste them.

A document is cut into sections at its `##`/`###` headings; a section's ```bash and ```python
blocks run in order, each in a fresh process (bash -euo pipefail, or the venv's python) in a
scratch directory with the venv's bin first on PATH. Environment variables a bash block exports
carry over to the blocks after it in the same section.

An HTML comment on the line before a block says how to run it:

    <!-- readme: background, ready "listening on" -->   a long-running command (a broker, as in
        a second terminal): started in the background, the section goes on once its output
        matches the pattern; it is stopped when the document's run ends
    <!-- readme: skip: <why> -->                          not run (a fragment: say why)
    <!-- readme: slow -->                                 run only by the slow test

Ports and paths are the reader's: the runner maps every port 9092-9099 the document names to a
free port of its own (and points the commands' default, 127.0.0.1:9092, at its stand-in: so a
broker the document starts must name its port), and /var/lib/oncelog, /tmp/oncelog* and /tmp/oc to scratch directories, so
that two runs (and the rest of the suite) never collide.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DIRECTIVE = re.compile(r"^<!--\s*readme:\s*(.*?)\s*-->\s*$")
PORT = re.compile(r"\b(909[2-9])\b")
PATHS = re.compile(r"(/var/lib/oncelog|/tmp/oncelog[\w.-]*|/tmp/oc\b)")


@dataclass
class Block:
    lang: str
    code: str
    line: int
    directive: str = ""

    @property
    def skipped(self) -> bool:
        return self.directive.startswith("skip")


@dataclass
class Section:
    title: str
    line: int
    blocks: list[Block] = field(default_factory=list)

    @property
    def runnable(self) -> list[Block]:
        return [b for b in self.blocks if not b.skipped]


def sections(path: Path) -> list[Section]:
    """The document's sections, each with its bash and python blocks."""
    out: list[Section] = [Section("(top)", 1)]
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("## ", "### ")):
            out.append(Section(line.lstrip("#").strip(), i + 1))
        elif line.startswith("```"):
            lang = line[3:].strip()
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if lang in ("bash", "python"):
                directive = ""
                j = start - 1
                while j >= 0 and not lines[j].strip():
                    j -= 1
                m = DIRECTIVE.match(lines[j]) if j >= 0 else None
                if m:
                    directive = m.group(1)
                out[-1].blocks.append(Block(lang, "\n".join(body) + "\n", start + 1, directive))
        i += 1
    return [s for s in out if s.blocks]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Reader:
    """One reader's terminal session over a document: ports, scratch paths, background jobs."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.ports: dict[str, str] = {}
        self.paths: dict[str, str] = {}
        self.background: list[subprocess.Popen] = []
        self.env = dict(os.environ)
        self.env["PATH"] = f"{VENV_BIN}{os.pathsep}{self.env.get('PATH', '')}"
        # A command without --bootstrap-server means 127.0.0.1:9092, the reader's broker
        self.env["ONCELOG_BOOTSTRAP_SERVER"] = self.localize("127.0.0.1:9092")
        self.env["PYTHONUNBUFFERED"] = "1"
        # `.venv/bin/oncelog ...` as written, from the scratch directory
        (scratch / ".venv").symlink_to(VENV_BIN.parent)
        # `bash scripts/kafka.sh ...` as written, as from the repository's root
        (scratch / "scripts").symlink_to(ROOT / "scripts")

    def localize(self, code: str) -> str:
        def port(m: re.Match) -> str:
            return self.ports.setdefault(m.group(1), str(free_port()))

        def path(m: re.Match) -> str:
            name = m.group(1).strip("/").replace("/", "-")
            return self.paths.setdefault(m.group(1), str(self.scratch / name))

        return PATHS.sub(path, PORT.sub(port, code))

    def run_section(self, section: Section, timeout: float = 300) -> None:
        env = dict(self.env)
        for block in section.runnable:
            started = time.monotonic()
            code = self.localize(block.code)
            where = f"{section.title!r}, the block at line {block.line}"
            if block.directive.startswith("background"):
                self._start_background(block, code, env, where)
            elif block.lang == "bash":
                env = self._run_bash(code, env, where, timeout)
            else:
                self._run([str(VENV_BIN / "python"), "-c", code], env, where, timeout)
            print(f"{time.monotonic() - started:6.1f} s  line {block.line} ({section.title})")

    def _run(self, argv: list[str], env: dict[str, str], where: str, timeout: float) -> None:
        # Output to files, not pipes: a process a block leaves behind (`cmd &`) would hold a
        # pipe open and the run would wait for it.
        out, err = self.scratch / ".block-stdout", self.scratch / ".block-stderr"
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(argv, cwd=self.scratch, env=env, stdout=o, stderr=e,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError(f"{where} did not finish in {timeout} s:\n"
                                     + err.read_text()[-4000:]) from None
        left = _kill_group(proc.pid)
        if code != 0:
            raise AssertionError(f"{where} failed (exit {code}):\n--- stdout\n"
                                 f"{out.read_text()[-4000:]}\n--- stderr\n{err.read_text()[-4000:]}")
        if left:
            raise AssertionError(f"{where} left processes running (a `cmd &`?): mark a "
                                 "long-running command as a background block instead")

    def _run_bash(self, code: str, env: dict[str, str], where: str, timeout: float
                  ) -> dict[str, str]:
        state = self.scratch / ".readme-env"
        script = (f"trap 'env -0 > {state}' EXIT\nset -euo pipefail\n" + code)
        self._run(["bash", "-c", script], env, where, timeout)
        after = {}
        for item in state.read_bytes().split(b"\0"):
            if b"=" in item:
                k, v = item.decode().split("=", 1)
                after[k] = v
        return after

    def _start_background(self, block: Block, code: str, env: dict[str, str], where: str
                          ) -> None:
        m = re.search(r'ready\s+"([^"]+)"', block.directive)
        ready = re.compile(m.group(1) if m else ".")
        log = self.scratch / f".background-{block.line}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(["bash", "-c", "exec " + code.strip()], cwd=self.scratch,
                                    env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.background.append(proc)
        deadline = time.monotonic() + 60
        while not ready.search(log.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{where}: not ready (exit {proc.poll()}):\n"
                                     + log.read_text()[-4000:])
            time.sleep(0.1)

    def close(self) -> None:
        """Stop the background commands (SIGTERM, as Ctrl-C would; SIGKILL after 20 s)."""
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.background:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _kill_group(pgid: int, grace: float = 15.0) -> bool:
    """Kill what is left of a block's process group after a grace period (a JVM that Spark
    started goes away by itself, a moment after its Python); True if anything was left."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
