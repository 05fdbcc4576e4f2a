"""TOML text -> settings dataclasses: strict, typed, with the key path in every error.

Parsing is driven by the dataclasses' type hints, so a new setting needs no parser code. An
unknown key (usually a typo, answered with the nearest known key), a wrong type or a bad
duration is a :class:`ConfigError` naming the key path (``wireguard.rekey_failing_after``)
and what was expected. Errors are raised without a file name; the loader adds it
(:func:`edgeheal.config.loads`), so one exception type carries every configuration problem
from here, from the generic rules and from a check's or remedy's own rules alike.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from edgeheal.config.schema import Config


class ConfigError(Exception):
    """A configuration problem, with the file and key path it concerns."""

    def __init__(self, key: str, problem: str, *, file: str | os.PathLike[str] = "") -> None:
        self.key, self.problem, self.file = key, problem, str(file)
        where = f"{self.file}: " if self.file else ""
        super().__init__(f"{where}{key}: {problem}" if key else f"{where}{problem}")

    def located(self, file: str) -> ConfigError:
        """This error, naming ``file`` unless it already names one."""
        return self if self.file else ConfigError(self.key, self.problem, file=file)


# --- durations --------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> float:
    """``"20s"``, ``"2m"``, ``"1h"``, ``"500ms"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as \"20s\", \"2m\", \"1h\" or seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    else:
        raise ValueError(
            f"expected a duration such as \"20s\", \"2m\", \"1h\" or seconds, got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# --- TOML -> dataclasses ----------------------------------------------------------------

def parse(text: str, *, source: str = "<string>") -> Config:
    """Parse TOML into a :class:`Config` with defaults applied; no cross-field rules."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("", f"not valid TOML: {err}", file=source) from None
    try:
        config: Config = _parse(Config, data, "")
    except ConfigError as err:
        raise err.located(source) from None
    return dataclasses.replace(config, source=source)


def _type_name(tp: Any, duration: bool = False) -> str:
    if duration and tp is float:
        return 'a duration such as "20s", "2m", "1h" or seconds'
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a, duration) for a in typing.get_args(tp)
                           if a is not type(None))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp))


def _convert(tp: Any, value: Any, key: str, duration: bool) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ValueError(f"expected {_type_name(tp)}, got {value!r}")
    if origin in (types.UnionType, typing.Union):
        errors = []
        for alt in typing.get_args(tp):
            if alt is type(None):
                continue
            try:
                return _convert(alt, value, key, duration)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(f"expected {_type_name(tp, duration)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"expected {_type_name(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{key}[{i}]", duration) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"expected a table, got {value!r}")
        return _parse(tp, value, key)  # type: ignore[arg-type]
    if tp is float and duration:
        return parse_duration(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ValueError(f"expected {_type_name(tp)}, got {value!r}")


def _parse(cls: type[Any], table: Mapping[str, Any], path: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    hints = typing.get_type_hints(cls)
    for key in table:
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(_join(path, key), f"unknown key{hint} (known keys: {known})")
    kwargs = {}
    for name, value in table.items():
        key = _join(path, name)
        try:
            kwargs[name] = _convert(hints[name], value, key,
                                    bool(fields[name].metadata.get("duration")))
        except ConfigError:
            raise
        except ValueError as err:
            raise ConfigError(key, str(err)) from None
    return cls(**kwargs)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def split_hostport(addr: str) -> tuple[str, int]:
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", addr)
    if not m:
        raise ValueError(f"expected host:port or [v6]:port, got {addr!r}")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 0 <= int(port) < 65536:
        raise ValueError(f"port out of range in {addr!r}")
    return host, int(port)


