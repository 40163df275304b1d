"""The one base of configuration errors: a caller that reads any configuration, spec or option catches this."""

from pathlib import Path


class ConfigError(ValueError):
    """A configuration, SLO spec or option value that cannot be used; the message says where and what was
    expected."""


def read_config_text(path: Path, what: str, error: type[ConfigError] = ConfigError) -> str:
    """The text of the configuration file at `path`; else `error` naming the file, what it is and why."""
    try:
        return Path(path).read_text(encoding="utf-8")  # YAML's encoding, whatever the locale's
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # a binary file given by mistake
        raise error(f"{path}: cannot read the {what}: not UTF-8 text (byte {exc.start})") from None
