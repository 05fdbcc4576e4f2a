"""tests/qemu_user.py: what ``scripts/test --arm64-unit`` deselects, and how it judges that a
run was arm64 code. These run in both tiers and in the chroot too, where the interpreter's
own ELF header says aarch64."""

from __future__ import annotations

import _ctypes
import platform
import sys
from pathlib import Path

import pytest

from tests import qemu_user


def test_an_entry_covers_the_test_its_parametrizations_or_its_file() -> None:
    entries = {"tests/a/test_x.py::test_one": "why", "tests/b/test_y.py": "why"}
    assert qemu_user.entry_for("tests/a/test_x.py::test_one", entries) == \
        "tests/a/test_x.py::test_one"
    assert qemu_user.entry_for("tests/a/test_x.py::test_one[v4]", entries) == \
        "tests/a/test_x.py::test_one"
    assert qemu_user.entry_for("tests/b/test_y.py::test_any[p]", entries) == "tests/b/test_y.py"
    assert qemu_user.entry_for("tests/a/test_x.py::test_two", entries) is None
    assert qemu_user.entry_for("tests/a/test_x.py::test_one_more", entries) is None


def test_every_unrunnable_entry_says_why() -> None:
    for nodeid, reason in qemu_user.UNRUNNABLE.items():
        assert nodeid.startswith("tests/"), nodeid
        assert len(reason.split()) >= 4, f"{nodeid}: give the reason, not a word"


def test_the_interpreter_is_an_elf_of_this_machine() -> None:
    number = qemu_user.elf_machine(Path(sys.executable).resolve())
    assert qemu_user.ELF_MACHINES[number] == platform.machine()


def test_a_file_that_is_not_elf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.so").write_bytes(b"#!/bin/sh\n" * 4)
    with pytest.raises(ValueError, match="not an ELF file"):
        qemu_user.elf_machine(tmp_path / "x.so")


def test_compiled_modules_names_each_extension_with_its_machine() -> None:
    found = qemu_user.compiled_modules({"_ctypes": _ctypes, "qemu_user": qemu_user})
    assert found == {_ctypes.__file__: platform.machine()}
    assert qemu_user.dependencies(found) == []  # the interpreter's own


def _report(**kw: object) -> dict[str, object]:
    site = "/site/yaml/_yaml.cpython-311-aarch64-linux-gnu.so"
    return {"machine": "aarch64", "compiled": {site: "aarch64"}, "matched": ["tests/x.py"],
            "deselected": {}, **kw}


def test_a_run_that_was_arm64_code_with_arm64_extensions_passes() -> None:
    assert qemu_user.problems("aarch64", [_report(), _report()], True, ["tests/x.py"]) == []


@pytest.mark.parametrize(("machine", "report", "expected"), [
    ("x86_64", _report(), "the controller ran on x86_64"),
    ("aarch64", _report(machine="x86_64"), "a worker ran on x86_64"),
    ("aarch64", _report(compiled={"/site/m.so": "x86_64"}), "not built for aarch64: /site/m.so"),
    ("aarch64", _report(compiled={}), "no compiled module of a dependency"),
])
def test_a_run_that_was_not_arm64_code_fails(machine: str, report: dict[str, object],
                                             expected: str) -> None:
    found = qemu_user.problems(machine, [report], True, ["tests/x.py"])
    assert any(expected in p for p in found), found


def test_no_report_fails() -> None:
    assert qemu_user.problems("aarch64", [], True, []) == [
        "no test session reported what it ran"]


def test_a_stale_entry_fails_only_a_run_of_the_whole_suite() -> None:
    entries = ["tests/x.py", "tests/gone.py::test_renamed"]
    (found,) = qemu_user.problems("aarch64", [_report()], True, entries)
    assert "match no test" in found
    assert "tests/gone.py::test_renamed" in found
    assert qemu_user.problems("aarch64", [_report()], False, entries) == []


def test_the_mode_has_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(qemu_user.ENV, "armhf")
    with pytest.raises(pytest.UsageError, match="the only mode is 'aarch64'"):
        qemu_user.active()
    monkeypatch.setenv(qemu_user.ENV, "aarch64")
    assert qemu_user.active() == "aarch64"
    monkeypatch.delenv(qemu_user.ENV)
    assert qemu_user.active() is None
