"""The compiled pieces of oncelog, both in records/: _recordwalk.c (the produce path's record
walk) and _columnar*.c (records sections to and from columns: the bulk produce and consume
paths); everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("oncelog.records._recordwalk", ["src/oncelog/records/_recordwalk.c"],
              depends=["src/oncelog/records/_varint.h"], extra_compile_args=["-O2"]),
    Extension("oncelog.records._columnar", ["src/oncelog/records/_columnar.c",
                                            "src/oncelog/records/_columnar_decode.c"],
              depends=["src/oncelog/records/_columnar.h", "src/oncelog/records/_varint.h"],
              extra_compile_args=["-O2"]),
])
