"""Strict YAML for sloscope's files (docs/configuration.md): the SLO spec and the collector's, remediation's and
sampling's configs are read through one loader. It keeps the line of every mapping and key, so that an error can
say `FILE:LINE: KEY: message`, and it refuses a key given twice, which yaml.safe_load lets the last one win: a
second `execute:` in remediation.yaml would otherwise decide silently."""

from __future__ import annotations

from collections.abc import Hashable

import yaml

from sloscope.errors import ConfigError


class Lines(dict):
    """A YAML mapping that knows the line (1-based) of itself and of each of its keys."""

    line = 0
    lines: dict = {}

    def line_of(self, key) -> int:
        return self.lines.get(key, self.line)


class StrictLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, keeping lines and refusing a key given twice."""


def _lines_mapping(loader: StrictLoader, node: yaml.MappingNode) -> Lines:
    # A merge key (`<<: *defaults`) brings keys that the mapping's own keys override, as YAML means: only a key
    # written twice in the mapping itself is a mistake.
    own = {id(key_node) for key_node, _ in node.value}
    loader.flatten_mapping(node)
    out = Lines()
    out.line, out.lines = node.start_mark.line + 1, {}
    written: dict = {}  # key -> its line, of the mapping's own keys
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a scalar", key_node.start_mark)
        line = key_node.start_mark.line + 1
        if id(key_node) in own:
            if key in written:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (first on line "
                                                        f"{written[key]})", key_node.start_mark)
            written[key] = line
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = line
    return out


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _lines_mapping)


def parse(text: str, source: str, error: type[ConfigError] = ConfigError):
    """The document of `text`, its mappings as Lines; `error` naming the file and line of a YAML mistake or of a
    key given twice, as `FILE:LINE: not valid YAML: ...`."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.MarkedYAMLError as exc:
        line = f":{exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise error(f"{source}{line}: not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc}") from None


def at(source: str, mapping, key=None) -> str:
    """`FILE:LINE` of `key` in `mapping` (of the mapping itself without a key, or when the key is not in it), or
    `FILE` where the YAML gives no line (a mapping not read by StrictLoader)."""
    line = mapping.line_of(key) if isinstance(mapping, Lines) else 0
    return f"{source}:{line}" if line else source


def key_at(source: str, mapping, key, path: str | None = None) -> str:
    """`FILE:LINE: KEY`, the start of an error about `key` of `mapping`, which goes on `: message`; `path` names
    the key where the mapping is nested (`spool.max_bytes`)."""
    return f"{at(source, mapping, key)}: {key if path is None else path}"


def refuse_unknown_keys(source: str, mapping, known, within: str = "") -> None:
    """ConfigError at the line of the first key of `mapping` that is not `known`, naming it and what is known;
    `within` names the mapping where it is nested (`spool`, `actions.A`)."""
    unknown = [key for key in mapping if str(key) not in known]
    if unknown:
        raise ConfigError(f"{at(source, mapping, unknown[0])}: {within + ': ' if within else ''}unknown key "
                          f"{str(unknown[0])!r} (expected one of {', '.join(known)})")
