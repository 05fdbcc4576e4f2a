"""Property: any configuration file -> a validated Config or a ConfigError (exit 2), never
another exception (issue 17: a non-UTF-8 file, deep nesting and a 5000-digit number each
once escaped as a traceback with exit 1, which systemd restarts forever).

Three generators, all through the full loader with the file checks ``check-config`` runs:

- documents over the real schema's keys (walked from the settings dataclasses, so a new
  setting is fuzzed without editing this file), each value either of the field's type
  (durations, names, addresses, paths...) or any TOML value (nan, inf, huge integers,
  NUL and control characters, nested arrays and tables), plus unknown keys;
- arbitrary bytes;
- a valid file (the shipped example) with bytes spliced in.

Deterministic in CI (``derandomize``, a bounded number of examples, no example database;
about 10 s on 2 loaded cores). ``EDGEHEAL_FUZZ=long`` runs 25 rounds of 5 times as many,
randomized, for a local soak (rounds, because Hypothesis keeps every example's choices of
one run: ~70 MB per 1000 schema documents).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeheal import config
from edgeheal import settings as validation
from edgeheal.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("EDGEHEAL_FUZZ") == "long"


ROUNDS = 25 if LONG else 1


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=examples * (5 if LONG else 1), derandomize=not LONG,
                    database=None, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def rounds(run: typing.Callable[[], None]) -> None:
    for _ in range(ROUNDS):
        run()


# --- TOML values and a writer -------------------------------------------------------------

SAMPLE_STRINGS = ["", " ", "auto", "tunnel", "direct", "3.1.1", "5", "edge-1", "edgeheal",
                  "127.0.0.1:9917", "[::1]:0", "0.0.0.0:1", "localhost:9917", "a..b:1",
                  "a/#", "a/+/b", "$SYS", "/", "/dev/zero", "/dev/null", "/nonexistent/x",
                  "/tmp", "relative/path", "k3s-agent.service", "sshd.service",
                  "app=flannel", "kube-flannel", "NHaGGWcW3a1sapt+JD/2harVDhDxKOnxBE9CNO0J/D8=",
                  "10.0.0.0/8", "wwan*", "tx-checksum-ipv4", "a" * 300]
durations = st.one_of(
    st.from_regex(r"-?[0-9]{1,6}(\.[0-9]{1,4})?(ms|s|m|h|d|x|)", fullmatch=True),
    st.sampled_from(["1ms", "0s", "nan", "inf", "1e9", "1000000000d", "9" * 40 + "s"]))
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2 ** 64), max_value=2 ** 64),
    st.sampled_from([0, -1, 65535, 65536, 10 ** 100]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(SAMPLE_STRINGS),
    durations)
toml_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(min_size=1, max_size=10), inner, max_size=4),
    max_leaves=12)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _string(key)


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def dump(value: Any) -> str:
    """One TOML value, inline (tables as ``{k = v}``, which TOML allows anywhere)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(dump(v) for v in value) + "]"
    return "{" + ", ".join(f"{_key(k)} = {dump(v)}" for k, v in value.items()) + "}"


def document(doc: dict[str, Any]) -> str:
    return "".join(f"{_key(k)} = {dump(v)}\n" for k, v in doc.items())


# --- documents over the real schema ---------------------------------------------------------

def _leaf(tp: Any, meta: typing.Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values of roughly the field's type, to get past the type check into the rules."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return st.sampled_from(typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return st.one_of([_leaf(a, meta) for a in typing.get_args(tp) if a is not type(None)])
    if origin is tuple:
        return st.lists(_leaf(typing.get_args(tp)[0], meta), max_size=3)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.one_of(st.integers(-3, 70000), st.sampled_from([10 ** 30, -(10 ** 30)]))
    if tp is float:
        return durations if meta.get("duration") else st.floats()
    return st.one_of(st.sampled_from(SAMPLE_STRINGS), st.text(max_size=20))


def table(cls: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        if f.name == "source":
            continue
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        sub = args[0] if typing.get_origin(tp) in (types.UnionType, typing.Union) \
            and len(args) == 1 and dataclasses.is_dataclass(args[0]) else tp
        if dataclasses.is_dataclass(sub):
            typed: st.SearchStrategy[Any] = st.deferred(lambda sub=sub: table(sub))
        elif typing.get_origin(sub) is tuple and dataclasses.is_dataclass(
                typing.get_args(sub)[0]):
            item = typing.get_args(sub)[0]
            typed = st.lists(st.deferred(lambda item=item: table(item)), max_size=3)
        else:
            typed = _leaf(sub, f.metadata)
        optional[f.name] = st.one_of(typed, typed, typed, toml_values)
    unknown = st.dictionaries(st.text(min_size=1, max_size=12), toml_values, max_size=1)
    return st.builds(lambda known, extra: {**known, **extra},
                     st.fixed_dictionaries({}, optional=optional),
                     st.one_of(st.just({}), st.just({}), st.just({}), unknown))


def _outcome(load: typing.Callable[[], Config]) -> str:
    """Load; 'valid', 'file' (the file itself) or 'key' (a key path named); anything but a
    Config or a ConfigError fails the property."""
    try:
        cfg = load()
    except ConfigError as err:
        text = str(err)
        assert text
        assert "\n" not in text, repr(text)
        assert "\x00" not in text, repr(text)
        assert len(text) < 2000, text[:200]
        return "key" if err.key else "file"
    assert isinstance(cfg, Config)
    return "valid"


def _load_file(tmp: Path, data: bytes) -> typing.Callable[[], Config]:
    def load() -> Config:
        path = tmp / "fuzz.toml"
        path.write_bytes(data)
        return validation.load(path, check_files=True)
    return load


def test_any_document_over_the_schema_is_a_config_or_a_config_error() -> None:
    seen: Counter[str] = Counter()

    @fuzz_settings(200)
    @given(table(Config))
    def run(doc: dict[str, Any]) -> None:
        text = document(doc)
        seen[_outcome(lambda: validation.loads(text, source="fuzz.toml", check_files=True))] \
            += 1

    rounds(run)
    # the generator reaches every stage: valid configs, key errors, file-level errors
    assert seen["valid"] >= 5, seen
    assert seen["key"] >= 50, seen
    print(f"schema documents: {dict(seen)}")


def test_any_bytes_are_a_config_or_a_config_error(tmp_path: Path) -> None:
    seen: Counter[str] = Counter()

    @fuzz_settings(150)
    @given(st.one_of(st.binary(max_size=400),
                     st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass"))))
    def run(data: bytes) -> None:
        seen[_outcome(_load_file(tmp_path, data))] += 1

    rounds(run)
    assert seen["file"] >= 30, seen
    print(f"arbitrary bytes: {dict(seen)}")


def test_the_example_with_bytes_spliced_in_is_a_config_or_a_config_error(
        tmp_path: Path) -> None:
    example = (ROOT / "edgeheal.example.toml").read_bytes()
    seen: Counter[str] = Counter()

    @fuzz_settings(150)
    @given(st.integers(0, len(example)), st.integers(0, 8),
           st.one_of(st.binary(min_size=1, max_size=12),
                     st.sampled_from([b"nan", b"inf", b"#", b"+", b"\x00", b"\\u0000",
                                      b"[[[[", b"\xff", b'"', b"\n[agent]\n", b"1ms",
                                      b"=", b"\n"])))
    def run(at: int, cut: int, splice: bytes) -> None:
        data = example[:at] + splice + example[at + cut:]
        seen[_outcome(_load_file(tmp_path, data))] += 1

    rounds(run)
    assert seen["valid"] >= 5, seen
    assert seen["key"] + seen["file"] >= 30, seen
    print(f"spliced example: {dict(seen)}")


def test_a_path_with_a_nul_is_a_config_error() -> None:
    assert _outcome(lambda: validation.load("/etc/edgeheal/a\x00b.toml")) == "file"
    assert _outcome(lambda: config.load_generic("/etc/edgeheal/a\x00b.toml")) == "file"
