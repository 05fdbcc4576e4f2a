"""TOML text -> settings dataclasses: strict, typed, with the key path in every error.

Parsing is driven by the dataclasses' type hints, so a new setting needs no parser code. An
unknown key (usually a typo, answered with the nearest known key), a wrong type or a bad
duration is a :class:`ConfigError` naming the key path (``wireguard.rekey_failing_after``)
and what was expected. Errors are raised without a file name; the loader adds it
(:func:`edgeheal.config.loads_generic`), so one exception type carries every configuration problem
from here, from the generic rules and from a check's or remedy's own rules alike.

What no input may do (issue 17): every number is finite and within its field's ``bounds``
(a duration without bounds: :data:`DURATION_BOUNDS`), so ``nan``, ``inf`` or ``1ms`` never
reach a timer; no string carries a NUL; a document nested too deeply for the TOML reader is
an error, not a ``RecursionError``; a value quoted in an error is shortened, and never
shown for a ``secret`` field.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from edgeheal.base.compat import tomllib
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

_DURATION = re.compile(r"^\s*(\d{1,30}(?:\.\d{1,30})?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_EXPECTED = 'expected a duration such as "20s", "2m", "1h" or seconds'

DURATION_BOUNDS = (0.0, 365 * 86400.0)
"""The range of a duration whose field declares no ``bounds`` of its own: never negative,
never past a year (a longer one is a typo, and would overflow date arithmetic)."""


def show(value: object, limit: int = 40) -> str:
    """``repr(value)``, shortened: an error message quotes what was given, not all of it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_duration(value: object) -> float:
    """``"20s"``, ``"2m"``, ``"1h"``, ``"500ms"`` or a number of seconds -> seconds.

    Raise :class:`ValueError` for anything else, a negative and a non-finite value (``nan``,
    ``inf``, a number too large for a float); the range of one setting is
    :func:`check_bounds`'s."""
    if isinstance(value, bool):
        raise ValueError(_EXPECTED)
    try:
        if isinstance(value, int | float):
            seconds = float(value)
        elif isinstance(value, str) and (m := _DURATION.match(value)):
            seconds = float(m.group(1)) * _UNIT[m.group(2)]
        else:
            raise ValueError(f"{_EXPECTED}, got {show(value)}")
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"{_EXPECTED}; {show(value)} is not a finite duration")
    if seconds < 0:
        raise ValueError(f"{_EXPECTED}; a duration cannot be negative, got {show(value)}")
    return seconds


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return f"{seconds}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    if 0 < seconds < 1 and round(seconds * 1000, 6) % 1 == 0:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def check_bounds(value: float, bounds: tuple[float, float], *, duration: bool) -> None:
    """Raise :class:`ValueError` unless ``value`` is finite and within ``bounds``."""
    least, most = bounds
    shown = format_duration if duration else (lambda v: f"{v:g}")
    allowed = f"allowed: {shown(least)} to {shown(most)}"
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number ({allowed}), got {value}")
    if value < least:
        need = ("must be greater than zero" if value <= 0 < least
                else f"must be at least {shown(least)}")
        raise ValueError(f"{need} ({allowed}), got {shown(value)}")
    if value > most:
        raise ValueError(f"must be at most {shown(most)} ({allowed}), got {shown(value)}")


# --- TOML -> dataclasses ----------------------------------------------------------------

def parse(text: str, *, source: str = "<string>") -> Config:
    """Parse TOML into a :class:`Config` with defaults applied; no cross-field rules."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("", f"not valid TOML: {err}", file=source) from None
    except RecursionError:
        raise ConfigError("", "not valid TOML: arrays or tables nested too deeply",
                          file=source) from None
    except ValueError:  # e.g. an integer of more than 4300 digits (int() refuses it)
        raise ConfigError("", "not valid TOML: a number too long to read", file=source) \
            from None
    try:
        config: Config = _parse(Config, data, "")
    except ConfigError as err:
        raise err.located(source) from None
    except RecursionError:  # a value nested deeper than any setting, quoted in an error
        raise ConfigError("", "a value is nested too deeply", file=source) from None
    sections = frozenset(key for key, value in data.items() if isinstance(value, dict))
    return dataclasses.replace(config, source=source, sections=sections)


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
        raise ValueError(f"expected {_type_name(tp)}, got {show(value)}")
    if origin in (types.UnionType, typing.Union):
        errors = []
        for alt in typing.get_args(tp):
            if alt is type(None):
                continue
            try:
                return _convert(alt, value, key, duration)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(f"expected {_type_name(tp, duration)}, got {show(value)}")
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"expected {_type_name(tp)}, got {show(value)}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{key}[{i}]", duration) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"expected a table, got {show(value)}")
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
            if "\x00" in value:
                raise ValueError("contains a NUL character")
            return value
    raise ValueError(f"expected {_type_name(tp)}, got {show(value)}")


def _parse(cls: type[Any], table: Mapping[str, Any], path: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    hints = typing.get_type_hints(cls)
    for key in table:
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            known = ", ".join(sorted(fields))
            shown = key if _BARE_KEY.fullmatch(key) else show(key)  # no raw newline or NUL
            raise ConfigError(_join(path, shown), f"unknown key{hint} (known keys: {known})")
    kwargs = {}
    for name, value in table.items():
        key, meta = _join(path, name), fields[name].metadata
        duration = bool(meta.get("duration"))
        try:
            kwargs[name] = converted = _convert(hints[name], value, key, duration)
            if isinstance(converted, float):
                bounds = meta.get("bounds") or (DURATION_BOUNDS if duration else None)
                if bounds is not None or not math.isfinite(converted):
                    check_bounds(converted, bounds or (-math.inf, math.inf),
                                 duration=duration)
        except ConfigError:
            raise
        except ValueError as err:
            problem = str(err)
            if meta.get("secret"):  # never quote a secret, even a malformed one
                problem = f"expected {_type_name(hints[name], duration)} (value not shown)"
            bounds = meta.get("bounds") or (DURATION_BOUNDS if duration else None)
            if bounds is not None and "allowed:" not in problem:
                problem += (f" (allowed: {format_duration(bounds[0])} to "
                            f"{format_duration(bounds[1])})" if duration else
                            f" (allowed: {bounds[0]:g} to {bounds[1]:g})")
            raise ConfigError(key, problem) from None
    return cls(**kwargs)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


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


