"""The one C extension: the receiver's fast path for OTLP trace requests (receiver/otlp_spans.py). Everything
else is declared in pyproject.toml. Optional: where it cannot be compiled, every request takes the general
decoder, with the same results."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("receiver._otlp_spans", ["receiver/otlp_spans.c"],
                             depends=["receiver/arrow_c_data.h"], extra_compile_args=["-O3", "-std=c11"],
                             optional=True)])
