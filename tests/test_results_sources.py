"""Every measured figure in ``docs/results/`` names where it came from (``docs/results/README.md``):
each section that holds a table states, in itself or in its file's opening, the command that produced
it (or that the command was not recorded) and at least one commit of main's history: a commit reachable from
``HEAD``, not one of a helper branch that was rebased before it landed (a fresh clone of main lacks those)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
COMMAND = re.compile(r"`(?:python[0-9.]* -m |make |npx )[^`]+`|```sh|not recorded")
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")


def _history_is_here() -> bool:
    """Whether this checkout holds the repository's whole history (not a shallow clone or an export)."""
    answer = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True, cwd=RESULTS
    )
    return answer.returncode == 0 and answer.stdout.strip() == "false"


def _commits(names: set[str]) -> set[str]:
    """Those of ``names`` that name a commit in ``HEAD``'s history."""
    return {
        name
        for name in names
        if subprocess.run(
            ["git", "merge-base", "--is-ancestor", name, "HEAD"], capture_output=True, cwd=RESULTS
        ).returncode
        == 0
    }


def _sections_with_tables(path: Path) -> list[tuple[str, str]]:
    """(title, text with the file's opening) of each ``## `` section of ``path`` that holds a table."""
    opening, *sections = re.split(r"(?m)^(?=## )", path.read_text())
    parts = [(opening.splitlines()[0], opening)] + [(s.splitlines()[0], opening + s) for s in sections]
    return [(title, text) for title, text in parts if re.search(r"(?m)^\| ", text)]


RESULT_FILES = sorted(p for p in RESULTS.glob("*.md") if p.name != "README.md")


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.name for p in RESULT_FILES])
def test_every_table_of_results_names_its_command_and_commit(path: Path) -> None:
    history = _history_is_here()
    for title, text in _sections_with_tables(path):
        assert COMMAND.search(text), f"{path.name} {title!r}: no command (or 'not recorded')"
        if not history:
            continue  # the commits cannot be looked up in a shallow clone
        named = {h for h in HEX.findall(text) if re.search(r"[0-9]", h)}
        assert _commits(named), f"{path.name} {title!r}: no commit in HEAD's history among {sorted(named)}"


def test_every_results_file_is_in_the_index() -> None:
    index = (RESULTS / "README.md").read_text()
    assert [p.name for p in RESULT_FILES if f"({p.name})" not in index] == []
