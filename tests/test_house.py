"""The house's size rule (issue 26): no module of the agent's bands over 400 lines, no lab
module over 600. A module over the line while it is being split is listed in OVER with the
size it has: it may shrink, never grow, and an entry back under the line must leave the
list (so the list only gets shorter)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "edgeheal"
AGENT_LIMIT = 400
LAB_LIMIT = 600
OVER: dict[str, int] = {}
"""Path under edgeheal/ -> lines at most, for a module over the line that is being split.
Empty since the twelve were split (2026-12-04); an entry may only shrink and must leave
once its module is back under the line."""


def _sizes() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(ROOT.rglob("*.py"))}


def test_no_module_grows_past_the_house_limits() -> None:
    over = []
    for path, lines in _sizes().items():
        limit = LAB_LIMIT if path.startswith("lab/") else OVER.get(path, AGENT_LIMIT)
        if lines > limit:
            over.append(f"{path}: {lines} lines (at most {limit}: split it along its jobs)")
    assert not over, "\n".join(over)


def test_the_list_of_modules_over_the_line_only_shrinks() -> None:
    sizes = _sizes()
    stale = [f"{path}: {sizes.get(path, 0)} lines, under {AGENT_LIMIT}: remove it from OVER"
             for path in OVER if sizes.get(path, 0) <= AGENT_LIMIT]
    assert not stale, "\n".join(stale)
