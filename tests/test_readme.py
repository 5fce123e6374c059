"""The README and the docs run as written: their shell and Python blocks, pasted in order into
a terminal, against the brokers they start (tests/support/readme.py says how blocks are run and
marked)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.readme import ROOT, Reader, sections

DOCUMENTS = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


@pytest.mark.slow
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(
    s.runnable for s in sections(ROOT / d))])
def test_the_document_runs_as_written(document: str, tmp_path: Path) -> None:
    reader = Reader(tmp_path)
    try:
        for section in sections(ROOT / document):
            reader.run_section(section)
    finally:
        reader.close()


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_left_out_says_why(document: str) -> None:
    for section in sections(ROOT / document):
        for block in section.blocks:
            if block.skipped:
                assert block.directive.partition(":")[2].strip(), (
                    f"{document}:{block.line}: a skipped block must say why")
