"""Every relative link in the docs and the README leads to a file that exists.

Why: the tree moved into bands once already; a link to a module that moved is a dead end
for exactly the reader the docs are for, and nothing else would notice.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s#]+)(?:#[^)]*)?\)")


def test_there_are_pages_with_links() -> None:
    assert sum(len(LINK.findall(p.read_text(encoding="utf-8"))) for p in PAGES) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    dead = sorted({target for target in LINK.findall(text)
                   if not (page.parent / target).exists()})
    assert not dead, f"{page.relative_to(ROOT)} links to missing files: {dead}"
