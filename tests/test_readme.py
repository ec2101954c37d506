"""The README's native trainer example runs as written against a real edge; its "Your own model"
section is the worked example CI trains (``examples/flax_cnn``, ``tests/test_examples.py``); every
measured figure it quotes points to the results file that holds its command and commit."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from .support import mnist_network_env

REPO = Path(__file__).resolve().parent.parent


def _block(heading: str, language: str = "python") -> str:
    """The first ``language`` block under the README's ``heading``."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(f"## {heading}\n") :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match is not None, f"the section {heading!r} has no {language} block"
    return match.group(1)


FIGURE = re.compile(r"\d(?:[\d.,–-]*\d)? ?(?:×|%)")  # a measured ratio or share: "2.93 ×", "6–7 %"


def test_every_figure_in_the_readme_points_to_its_results() -> None:
    """A paragraph that quotes a figure links to ``docs/results/`` (the file that names its command and
    commit, ``tests/test_results_sources.py``); a table does, or the paragraph that opens it."""
    blocks = re.split(r"\n\s*\n", (REPO / "README.md").read_text())
    unsourced = [
        block.strip().splitlines()[0][:80]
        for before, block in zip(["", *blocks], blocks, strict=False)
        if FIGURE.search(block)
        and "docs/results/" not in block
        and not (block.lstrip().startswith("|") and "docs/results/" in before)
    ]
    assert unsourced == []


def test_the_readmes_own_model_section_is_the_worked_example_ci_trains() -> None:
    example = REPO / "examples" / "flax_cnn"
    assert _block("Your own model") == (example / "model.py").read_text()
    assert 'workload = "examples.flax_cnn.model:learner"' in (example / "network.toml").read_text()


def test_the_readme_trainer_example_trains_a_window_and_prints_its_candidate(
    tmp_path: Path, dataset_root: Path
) -> None:
    code = _block("Native trainer API")
    follow = "trainer.run([experiment])"
    assert code.count(follow) == 1  # the last line follows heads for ever: everything before it runs here
    with mnist_network_env(tmp_path, dataset_root) as (edge, validator, root):
        validator.ensure_genesis(validator.network.experiment(validator.network.experiments[0].key))
        for written, here in (
            ("var/demo/network.json", str(root / "network.json")),
            ("http://127.0.0.1:8000", edge.url),
            ('"./node"', repr(str(root / "node"))),
        ):
            assert code.count(written) == 1, written
            code = code.replace(written, here)
        scope: dict[str, object] = {}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code[: code.index(follow)], "README.md", "exec"), scope)
        scope["trainer"].close()  # type: ignore[attr-defined]
        printed = out.getvalue().strip()
        assert printed in {c.candidate_id for c in validator.edge.candidates(validator.network.experiments[0].key)}
