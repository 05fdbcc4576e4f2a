"""Every registered remedy is documented: its row in docs/remediation.md's table of
remedies, and each of its settings in docs/configuration.md (the generated reference)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeheal import remedies
from edgeheal.config import reference

DOCS = Path(__file__).resolve().parents[2] / "docs"
REGISTERED = remedies.registrations(None)  # both ladders: Flannel's and the uplink's rungs


def test_the_builtin_remedies_are_registered() -> None:
    assert [r.module for r in REGISTERED] == list(remedies.BUILTIN)


@pytest.mark.parametrize("reg", REGISTERED, ids=[r.mode for r in REGISTERED])
def test_each_remedy_has_its_row_in_the_remediation_docs(
        reg: remedies.RemedyRegistration) -> None:
    text = (DOCS / "remediation.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith(f"| `{reg.mode}` |")]
    assert rows, f"docs/remediation.md has no row for remedy {reg.mode!r} in its table " \
        "of remedies"
    assert reg.doc, f"remedy {reg.mode!r} registers no doc line"
    assert reg.doc in rows[0], f"the row of {reg.mode!r} should say its doc line"
    if reg.settings:
        assert f"`[{reg.settings}]`" in rows[0], f"the row of {reg.mode!r} should name " \
            f"[{reg.settings}]"


@pytest.mark.parametrize("reg", [r for r in REGISTERED if r.settings],
                         ids=[r.mode for r in REGISTERED if r.settings])
def test_each_remedy_setting_is_in_the_configuration_reference(
        reg: remedies.RemedyRegistration) -> None:
    keys = [key for key, _, _ in reference() if key.startswith(f"{reg.settings}.")]
    assert keys, f"{reg.mode!r} names settings [{reg.settings}], which have no keys"
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = [key for key in keys if f"| `{key}` |" not in text]
    assert not missing, f"docs/configuration.md lacks {missing}; run " \
        "`scripts/generate`"
