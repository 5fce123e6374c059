"""The one compiled piece of oncelog (records/_recordwalk.c: the produce path's record walk);
everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("oncelog.records._recordwalk",
                             ["src/oncelog/records/_recordwalk.c"],
                             extra_compile_args=["-O2"])])
