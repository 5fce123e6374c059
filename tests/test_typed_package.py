"""oncelog is a typed package (PEP 561): a user's type checker reads its annotations."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_mypy_checks_user_code_against_oncelog_annotations(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent("""\
        import asyncio
        from oncelog import Consumer, Producer, TopicPartition
        from oncelog.aio import AsyncProducer

        def ok(producer: Producer, consumer: Consumer) -> None:
            partitions: list[int] = producer.partitions_for("t")
            for record in consumer:
                value: bytes | None = record.value
            consumer.assign([TopicPartition("t", 0)])

        def wrong(producer: Producer) -> None:
            count: int = producer.partitions_for("t")

        async def wrong_async(producer: AsyncProducer) -> None:
            offset: str = (await producer.send_and_wait("t", b"v")).offset
        """))
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          "--cache-dir", str(tmp_path / "cache"), str(script)],
                         capture_output=True, text=True, cwd=tmp_path)
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    # Without py.typed mypy would skip oncelog ("missing library stubs or py.typed marker")
    # and find neither mistake.
    assert "py.typed" not in run.stdout
    assert [line.split(":")[1] for line in errors] == ["12", "15"], run.stdout
    assert "list[int]" in errors[0] and '"int"' in errors[1], run.stdout


def test_the_marker_ships_in_the_package() -> None:
    import oncelog

    assert (Path(oncelog.__file__).parent / "py.typed").is_file()
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert 'oncelog = ["py.typed", "*.pyi"]' in pyproject


def test_every_public_method_of_the_public_api_has_a_docstring() -> None:
    import inspect

    import oncelog
    import oncelog.aio
    import oncelog.client

    classes = {getattr(module, name) for module in (oncelog, oncelog.aio, oncelog.client)
               for name in module.__all__ if inspect.isclass(getattr(module, name))}
    missing = []
    for cls in sorted(classes, key=lambda c: c.__name__):
        if issubclass(cls, BaseException) or not cls.__module__.startswith("oncelog"):
            continue
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if isinstance(fn, property):
                fn = fn.fget
            if inspect.isfunction(fn) and not inspect.getdoc(fn):
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []
