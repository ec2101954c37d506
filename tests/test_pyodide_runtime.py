"""Assembling the Pyodide runtime with Python alone (no Node), offline: the npm-registry path is fed
the metadata and tarball a registry would send, built from the installed node_modules copy (and, when
npm's cache holds it, the very tarball npm downloaded, checked against the real locked integrity)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tools.pyodide_runtime import (
    CORE_FILES,
    CORE_SHA256,
    LOCK_SHA256,
    NPM_REGISTRY,
    PYODIDE_VERSION,
    copy_runtime,
    core_from_tarball,
    fetch_npm_tarball,
    lock_integrity,
    prepare_runtime,
    verify_runtime,
)

from .conftest import REPO

NODE_PYODIDE = REPO / "node_modules" / "pyodide"
RUNTIME = REPO / "var" / "pyodide"
TARBALL_URL = f"{NPM_REGISTRY}/pyodide/-/pyodide-{PYODIDE_VERSION}.tgz"


def _need(path: Path, made_by: str) -> None:
    """Under CI (``make test`` has set everything up) a missing input is a failure, else a skip."""
    if not path.exists():
        message = f"{path} is missing ({made_by})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _tarball_from_node_modules() -> bytes:
    """An npm-style tarball (``package/...``) of the installed pyodide package."""
    _need(NODE_PYODIDE / "pyodide-lock.json", "npm ci")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(NODE_PYODIDE.iterdir()):
            if path.is_file():
                archive.add(path, arcname=f"package/{path.name}")
    return buffer.getvalue()


def _registry(tarball: bytes, *, integrity: str | None = None, url: str = TARBALL_URL) -> Callable[[str], bytes]:
    """What the npm registry answers for pyodide's version metadata and its tarball; anything else fails."""
    metadata = {
        "name": "pyodide",
        "version": PYODIDE_VERSION,
        "dist": {"integrity": integrity or _integrity(tarball), "tarball": url},
    }
    served = {f"{NPM_REGISTRY}/pyodide/{PYODIDE_VERSION}": json.dumps(metadata).encode(), url: tarball}

    def fetch(requested: str) -> bytes:
        assert requested in served, f"unexpected download {requested}"
        return served[requested]

    return fetch


def _lock_with(tmp_path: Path, integrity: str) -> Path:
    lock = tmp_path / "package-lock.json"
    lock.write_text(
        json.dumps({"packages": {"node_modules/pyodide": {"version": PYODIDE_VERSION, "integrity": integrity}}})
    )
    return lock


def test_the_core_is_assembled_from_the_registry_tarball_with_python_alone(tmp_path: Path) -> None:
    tarball = _tarball_from_node_modules()
    integrity = _integrity(tarball)
    data = fetch_npm_tarball("pyodide", PYODIDE_VERSION, integrity, _registry(tarball))
    core_from_tarball(data, tmp_path / "core")
    for name in CORE_FILES:
        assert (tmp_path / "core" / name).read_bytes() == (NODE_PYODIDE / name).read_bytes(), name
        assert hashlib.sha256((tmp_path / "core" / name).read_bytes()).hexdigest() == CORE_SHA256[name]
    assert sorted(path.name for path in (tmp_path / "core").iterdir()) == sorted(CORE_FILES)  # nothing else
    assert CORE_SHA256["pyodide-lock.json"] == LOCK_SHA256


def test_a_tarball_other_than_the_locked_one_is_refused(tmp_path: Path) -> None:
    tarball = _tarball_from_node_modules()
    integrity = _integrity(tarball)
    tampered = tarball[:-1] + bytes([tarball[-1] ^ 1])
    with pytest.raises(SystemExit, match="does not match the locked integrity"):
        fetch_npm_tarball("pyodide", PYODIDE_VERSION, integrity, _registry(tampered, integrity=integrity))
    with pytest.raises(SystemExit, match=r"not the one package-lock\.json records"):
        fetch_npm_tarball("pyodide", PYODIDE_VERSION, integrity, _registry(tarball, integrity=_integrity(b"other")))
    with pytest.raises(SystemExit, match="is not on"):
        fetch_npm_tarball(
            "pyodide", PYODIDE_VERSION, integrity, _registry(tarball, url="https://elsewhere.example/p.tgz")
        )


def test_prepare_runtime_from_the_registry_without_node_modules(tmp_path: Path) -> None:
    """The whole assembly as a host without Node runs it: no node_modules, the lock's integrity, the
    packages already in place (so nothing is downloaded from PyPI either)."""
    _need(RUNTIME / "pyodide-lock.json", "make setup assembles var/pyodide")
    tarball = _tarball_from_node_modules()
    out = tmp_path / "runtime"
    out.mkdir()
    for wheel in RUNTIME.iterdir():
        if wheel.suffix in (".whl", ".zip") and wheel.name != "python_stdlib.zip":
            shutil.copyfile(wheel, out / wheel.name)
    prepare_runtime(
        out,
        tmp_path / "no-node-modules",
        None,
        core="npm-registry",
        package_lock=_lock_with(tmp_path, _integrity(tarball)),
        fetch=_registry(tarball),
    )
    assert "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl" in verify_runtime(out)


def test_the_real_npm_tarball_matches_the_real_lock(tmp_path: Path) -> None:
    """The tarball npm itself downloaded (npm's content-addressed cache, when it holds it) passes the
    registry path with package-lock.json's own integrity and gives the same core files."""
    integrity = lock_integrity(REPO / "package-lock.json")
    digest = base64.b64decode(integrity.removeprefix("sha512-")).hex()
    cached = Path.home() / ".npm" / "_cacache" / "content-v2" / "sha512" / digest[:2] / digest[2:4] / digest[4:]
    if not cached.exists():
        pytest.skip(f"npm's cache has no copy of pyodide {PYODIDE_VERSION} ({cached})")
    data = fetch_npm_tarball("pyodide", PYODIDE_VERSION, integrity, _registry(cached.read_bytes(), integrity=integrity))
    core_from_tarball(data, tmp_path)
    for name in CORE_FILES:
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == CORE_SHA256[name], name


def test_a_shipped_runtime_is_checked_file_by_file(tmp_path: Path) -> None:
    _need(RUNTIME / "pyodide-lock.json", "make setup assembles var/pyodide")
    copy_runtime(RUNTIME, tmp_path / "copy")
    assert verify_runtime(tmp_path / "copy") == verify_runtime(RUNTIME)
    tampered = tmp_path / "tampered"
    shutil.copytree(tmp_path / "copy", tampered)
    wheel = next(tampered.glob("numpy-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(SystemExit, match="sha256 does not match"):
        copy_runtime(tampered, tmp_path / "refused")
    (tampered / "pyodide.js").write_text("// not pyodide")
    with pytest.raises(SystemExit, match="is not pyodide"):
        verify_runtime(tampered)
