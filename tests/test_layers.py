"""The layer rule: imports only point down, for every package of the project.

protocol                      (stdlib + NumPy only; test_protocol_core checks the third-party side)
datasets      -> protocol
server        -> protocol, datasets
native_peer   -> protocol, datasets
browser_peer  -> protocol
tools         -> the above
lab           -> the above and tools
deploy        -> the above and lab
benchmarks    -> the above and lab
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "datasets", "server", "native_peer", "browser_peer", "tools", "lab", "deploy", "benchmarks")
_PEERS = {"protocol", "datasets", "server", "native_peer", "browser_peer"}
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "datasets": {"protocol"},
    "server": {"protocol", "datasets"},
    "native_peer": {"protocol", "datasets"},
    "browser_peer": {"protocol"},
    "tools": _PEERS,
    "lab": _PEERS | {"tools"},
    "deploy": _PEERS | {"tools", "lab"},
    "benchmarks": _PEERS | {"tools", "lab", "deploy"},
}


def _our_imports(path: Path) -> set[str]:
    """The packages of this project that the module at ``path`` imports (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & set(PACKAGES)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_only_point_down(package: str) -> None:
    modules = sorted((REPO / package).rglob("*.py"))
    assert modules, f"{package} has no modules"
    violations = {
        str(path.relative_to(REPO)): sorted(imported - ALLOWED[package] - {package})
        for path in modules
        if (imported := _our_imports(path)) - ALLOWED[package] - {package}
    }
    assert violations == {}


def test_the_rule_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from server.app import create_app\nimport lab.demo\nfrom . import sibling\n")
    assert _our_imports(module) == {"server", "lab"}
