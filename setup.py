"""Packaging that pyproject.toml cannot say alone.

Everything installs under one name, `sloscope`: the stage folders at the repository's top level (analytics/,
probes/, ...) are the subpackages `sloscope.analytics`, `sloscope.probes`, ... beside the contracts in sloscope/.
The folders stay where a newcomer looks for them; the mapping is done here, once.

The one C extension is the receiver's fast path for OTLP trace requests (receiver/otlp_spans.py). Optional: where
it cannot be compiled, every request takes the general decoder, with the same results."""

from pathlib import Path

from setuptools import Extension, setup

STAGES = ("probes", "simulator", "live", "edge", "collectors", "receiver", "enrich", "analytics", "alerts",
          "sampling", "dashboards", "commands")


def packages_of(folder: str, name: str) -> dict[str, str]:
    """Each package under folder (a directory with __init__.py), by its installed name."""
    root = Path(folder)
    return {".".join([name, *init.parent.relative_to(root).parts]): init.parent.as_posix()
            for init in sorted(root.rglob("__init__.py"))}


PACKAGE_DIR = packages_of("sloscope", "sloscope")
for stage in STAGES:
    PACKAGE_DIR |= packages_of(stage, f"sloscope.{stage}")

setup(packages=list(PACKAGE_DIR), package_dir=PACKAGE_DIR,
      ext_modules=[Extension("sloscope.receiver._otlp_spans", ["receiver/otlp_spans.c"],
                             depends=["receiver/arrow_c_data.h"], extra_compile_args=["-O3", "-std=c11"],
                             optional=True)])
