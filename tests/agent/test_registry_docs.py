"""Every registered check module is documented: a new check cannot land without its docs.

Driven by the registry, so the test names no check: its settings rows in
``docs/configuration.md``, each alert kind in ``docs/alerts.md`` and in the alert schema's
``kind`` enum, and its row in the checks index ``docs/checks.md``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgeheal import checks, config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

REGISTRATIONS = checks.registrations()
MODULES = [reg.module for reg in REGISTRATIONS]
KINDS = [(reg.module, kind) for reg in REGISTRATIONS for kind in reg.kinds]


def _table_keys(path: Path) -> set[str]:
    """The backquoted first cell of every Markdown table row."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", path.read_text(), re.MULTILINE))


def test_the_registry_is_not_empty() -> None:
    assert MODULES
    assert KINDS


@pytest.mark.parametrize("module", MODULES)
def test_a_check_modules_settings_are_in_the_configuration_reference(module: str) -> None:
    keys = [key for key, _, _ in config.reference() if key.split(".")[0] == module]
    assert keys, f"no [{module}] settings in config.reference()"
    missing = sorted(set(keys) - _table_keys(DOCS / "configuration.md"))
    assert not missing, f"docs/configuration.md lacks {missing}; run " \
        "`scripts/generate`"


@pytest.mark.parametrize(("module", "kind"), KINDS)
def test_a_check_modules_alert_kinds_are_in_the_alert_table(module: str, kind: str) -> None:
    assert kind.startswith(f"{module}."), "a check's alert kinds are named <module>.<event>"
    assert kind in _table_keys(DOCS / "alerts.md"), f"docs/alerts.md has no row for {kind}"


@pytest.mark.parametrize(("module", "kind"), KINDS)
def test_a_check_modules_alert_kinds_are_in_the_schema_enum(module: str, kind: str) -> None:
    schema = json.loads((ROOT / "schemas" / "alert.schema.json").read_text())
    assert kind in schema["properties"]["kind"]["enum"], \
        f"schemas/alert.schema.json's kind enum lacks {kind}"


@pytest.mark.parametrize("module", MODULES)
def test_a_check_module_has_a_row_in_the_checks_index(module: str) -> None:
    rows = [line for line in (DOCS / "checks.md").read_text().splitlines()
            if line.startswith("|")]
    path = f"edgeheal/checks/{module}.py"
    if not (ROOT / path).exists():  # a check that needs several modules is a package
        path = f"edgeheal/checks/{module}/__init__.py"
    assert (ROOT / path).exists(), f"no module {path}"
    link = f"(../{path})"
    assert any(link in row for row in rows), f"docs/checks.md has no row linking {link}"


def test_the_alert_kinds_table_is_the_generated_one() -> None:
    from edgeheal.agent.alerts import kinds

    text = (DOCS / "alerts.md").read_text()
    begin = text.index("<!-- generated: `edgeheal alert kinds")
    table = text[text.index("\n", begin) + 1:text.index("<!-- end of generated table -->")]
    assert table == kinds.markdown_table(), \
        "docs/alerts.md's kinds table is stale: regenerate it with `scripts/generate`"


def test_the_schema_kind_enum_is_the_generated_one() -> None:
    from edgeheal.agent.alerts import kinds

    schema = json.loads((ROOT / "schemas" / "alert.schema.json").read_text())
    assert schema["properties"]["kind"]["enum"] == kinds.schema_enum(), \
        "schemas/alert.schema.json's kind enum is stale: regenerate it with `scripts/generate`"
