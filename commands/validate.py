"""`sloscope validate FILE...`: each of sloscope's YAML files read as the command that takes it reads it, without
running anything (docs/configuration.md). It lives here, beside the commands that compose stages, because the four
files belong to four stages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Each reader is the config's own module, which needs none of the server's packages: a node with the agent's
# install validates its files too (tests/project/test_agent_install.py).
from sloscope import slo_spec, yaml_config
from sloscope.alerts import remediation_config
from sloscope.collectors import config as collector
from sloscope.errors import ConfigError, read_config_text
from sloscope.sampling import config as sampling_config

EXIT_OK, EXIT_INVALID = 0, 2

# kind -> (its top-level keys, a loader of a path that raises ConfigError): the commands' own loaders.
READERS = {
    "slo": (slo_spec.SPEC_REQUIRED + slo_spec.SPEC_OPTIONAL, slo_spec.load_spec),
    # The file alone: an OTEL_* variable of this shell would otherwise stand in for what the file says.
    "collector": (collector.FILE_KEYS, lambda path: collector.load(str(path), environ={})),
    "remediation": (remediation_config.CONFIG_KEYS, remediation_config.load_config),
    "sampling": (sampling_config.CONFIG_KEYS, sampling_config.load_config),
}
KINDS = tuple(READERS)

DESCRIPTION = """\
Check sloscope's YAML files without running anything, each read by the code of the command that takes it:
  slo          an SLO spec (--slo of ingest, rca, serve, rules, dashboards, report, webhook, sampling)
  collector    the node collector's config (collect --config)
  remediation  the remediation allow-list (webhook --config; alerts/remediation.example.yaml)
  sampling     the adaptive sampling config (sampling --config, serve --sampling)
What is checked: the YAML itself, a key given twice (which YAML readers otherwise let the last one win),
unknown keys, types, ranges and enumerations, durations and sizes, and what depends on more than one key:
the spec's default_tier among its tiers and its declared causes and evidence, each remediation action's
parameters, the collector's probe names and probe options, its TLS files being readable (relative paths from
here) and its endpoint a URL. The collector's file is checked alone, without the OTEL_* variables.

The kind is told from each file's top-level keys; --kind reads every FILE as the one given. Each file gets one
line: `FILE: ok (KIND)` on stdout, or its first error on stderr, which names the file and the key, and the line
(`FILE:LINE: KEY: message`) in every config and in the spec's YAML and declared causes. Exit status: 0 when
every file is valid, 2 otherwise. The same files' JSON Schemas, for editors and CI, are in docs/schemas/."""


def register(subparsers) -> None:
    validate = subparsers.add_parser(
        "validate", help="check SLO specs and collector, remediation and sampling configs without running them",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=DESCRIPTION)
    validate.add_argument("files", nargs="+", type=Path, metavar="FILE", help="a YAML file to check")
    validate.add_argument("--kind", choices=KINDS,
                          help="read every FILE as this kind (default: told from each file's top-level keys)")
    validate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    valid = [_check(path, args.kind) for path in args.files]
    return EXIT_OK if all(valid) else EXIT_INVALID


def _check(path: Path, kind: str | None) -> bool:
    """Print `FILE: ok (KIND)` or the file's error; whether it is valid."""
    try:
        kind = kind or kind_of(path)
        READERS[kind][1](path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return False
    print(f"{path}: ok ({kind})")
    return True


def kind_of(path: Path) -> str:
    """The kind whose keys most of the file's top-level keys are: a misspelt key still finds its kind, whose
    loader then names it. ConfigError when no kind has any of them, or two have as many."""
    doc = yaml_config.parse(read_config_text(path, "file"), str(path))
    keys = sorted(map(str, doc)) if isinstance(doc, dict) else []
    shared = {kind: len(set(keys) & set(known)) for kind, (known, _) in READERS.items()}
    best = max(shared.values())
    found = [kind for kind, count in shared.items() if count == best]
    if not best or len(found) > 1:
        raise ConfigError(f"{path}: cannot tell its kind from its top-level keys ({', '.join(keys) or 'none'}); "
                          f"give --kind, one of {', '.join(KINDS)}")
    return found[0]
