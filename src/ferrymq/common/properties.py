"""RocketMQ-style ``key=value`` configuration files (a minimal java.util.Properties reader)."""

from __future__ import annotations

import os

from ferrymq.errors import ConfigError


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` / ``key: value`` lines; ``#`` and ``!`` start comments; blanks around keys and values
    are dropped; a later line wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#!":
            continue
        idx = min((i for i in (s.find("="), s.find(":")) if i >= 0), default=-1)
        if idx < 0:
            key, value = s, ""
        else:
            key, value = s[:idx].strip(), s[idx + 1:].strip()
        out[key] = value
    return out


def read_config_text(path: str, key: str) -> str:
    """A configuration file's text; ConfigError naming ``key`` when it cannot be read or is not UTF-8 text."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(key, f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def read_properties(path: str) -> dict[str, str]:
    """The file's properties; ConfigError (key ``-c``) when it cannot be read or is not UTF-8 text."""
    return parse_properties(read_config_text(path, "-c"))


def parse_bool(key: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    raise ConfigError(key, f"expected true or false, got {raw!r}")


def parse_int(key: str, raw: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(key, f"expected an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(key, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(key, f"must be <= {maximum}, got {value}")
    return value


def update_properties_file(path: str, updates: dict[str, str]) -> None:
    """Replace the lines setting ``updates``' keys in the properties file ``path`` (the last one of a key
    that appears twice; earlier ones are dropped), append the keys it lacks; written to a temporary file and
    renamed over the old one."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        lines = []
    last_line: dict[str, int] = {}
    for i, line in enumerate(lines):
        key = _line_key(line)
        if key in updates:
            last_line[key] = i
    out: list[str] = []
    for i, line in enumerate(lines):
        key = _line_key(line)
        if key in updates:
            if last_line[key] == i:
                out.append(f"{key}={updates[key]}")
            continue
        out.append(line)
    out.extend(f"{k}={v}" for k, v in updates.items() if k not in last_line)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("\n".join(out) + "\n")
    os.replace(tmp, path)


def _line_key(line: str) -> str | None:
    s = line.strip()
    if not s or s[0] in "#!":
        return None
    idx = min((i for i in (s.find("="), s.find(":")) if i >= 0), default=-1)
    return (s if idx < 0 else s[:idx]).strip()
