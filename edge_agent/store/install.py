"""The two steps of an install that touch bytes: stage and verify, then publish.

Split from the store so each step's crash story reads in one place: staging
lives in the store's tmp folder (swept by the next update), and publishing is
renames only, each of a complete, fsynced file or folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import copy_hashing, fault, fsync_dir, hash_file
from edge_agent.store.release import Release, SignedRelease
from edge_agent.store.verify import RELEASE_FILE


def stage(release: Release, source: Path, staging: Path, link: bool) -> None:
    """Bring every file into `staging/blobs`, hashing the bytes that land there."""
    (staging / "blobs").mkdir()
    for entry in release.files:
        staged = staging / "blobs" / entry.sha256
        if staged.exists():
            continue  # the same bytes twice in one release
        src = source / entry.path
        if link:
            _link(src, staged)
            digest, size = hash_file(staged)
        else:
            digest, size = copy_hashing(src, staged)
        if size != entry.size or digest != entry.sha256:
            raise EdgeAgentError(
                f"{release.name} v{release.version} file {entry.path}: got {size} bytes "
                f"with sha256 {digest[:16]}, the release says {entry.size} bytes with "
                f"{entry.sha256[:16]}",
                "fetch the file again; it was truncated, extended or altered",
                "transfer.digest",
            )


def publish(signed: SignedRelease, staging: Path, blobs: Path, versions: Path) -> None:
    """Move verified blobs into place, then the version folder, each by one rename."""
    release = signed.release
    blobs.mkdir(parents=True, exist_ok=True)
    for staged in (staging / "blobs").iterdir():
        final = blobs / staged.name
        # A blob already there is taken only when its bytes still hash to its name: a
        # version linked to one rotted on an SD card served the rot, and so did every
        # later version of the same bytes, "publish a higher version" included.
        if not final.exists() or not _intact(final):
            staged.chmod(0o444)  # a version's file is the blob: nobody edits it in place
            staged.replace(final)
    fsync_dir(blobs)
    fault("install.blobs")
    folder = staging / "version"
    for entry in release.files:
        target = folder / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(blobs / entry.sha256, target)
    (folder / RELEASE_FILE).write_bytes(signed.to_json())
    _fsync_tree(folder)
    fault("install.linked")
    versions.mkdir(parents=True, exist_ok=True)
    folder.rename(versions / str(release.version))
    fault("install.after_rename")
    fsync_dir(versions)


def _intact(blob: Path) -> bool:
    """Whether a blob's bytes hash to its name (which is their sha256)."""
    try:
        digest, _ = hash_file(blob)
    except (OSError, EdgeAgentError):
        return False  # unreadable, or no longer a regular file: the staged copy replaces it
    return digest == blob.name


def _link(src: Path, dst: Path) -> None:
    """`dst` as a second name of `src`'s file; a copy where a hard link cannot be made
    (another file system, or one without hard links)."""
    if src.is_symlink() or not src.is_file():
        raise EdgeAgentError(f"{src} is not a regular file", code="store.path")
    try:
        os.link(src, dst)
    except OSError:
        copy_hashing(src, dst)


def _fsync_tree(folder: Path) -> None:
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))
