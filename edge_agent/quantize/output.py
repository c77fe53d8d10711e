"""Calibration output, written whole or not at all.

A calibration run builds its output folder in a hidden sibling of `--out`
(same file system) and renames it into place only when every file is there.
A re-run replaces the previous output as one step as far as POSIX allows: the
old folder is renamed aside, the new one renamed in, the old one removed. So a
reader sees either the previous complete output or the new one, never an INT8
`model.xml` from last time beside a report from this time, and a failed run
leaves the previous output untouched.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from pathlib import Path

from edge_agent.errors import EdgeAgentError

REPORT = "model.report.json"
_FIX = "pass --out a folder in a writable place (it is created, and replaced on a re-run)"


def _staging_prefix(out: Path) -> str:
    return f".{out.name}.partial-"


def _aside_prefix(out: Path) -> str:
    return f".{out.name}.old-"


def check_output(out: Path) -> None:
    """Fail fast, before any work, when `out` cannot become the output folder.

    Creates `out`'s parent folders if need be and probes them with a real write
    (permission bits alone say nothing to root, or about a read-only mount).

    Raises:
        EdgeAgentError: path.unwritable, naming the reason.
    """
    discard(begin_output(out))


def begin_output(out: Path) -> Path:
    """Make and return an empty staging folder beside `out`, on its file system.

    Raises:
        EdgeAgentError: path.unwritable when `out` is a file, holds something that is
            not a calibration output, is the current folder or one above it, or its
            folder cannot be written.
    """
    if out.name in ("", ".", "..") or _holds_cwd(out):
        # `--out .` passed this check and failed at the last rename, after the whole run:
        # the staging folder went inside the output, and "." cannot be renamed.
        raise EdgeAgentError(
            f"output {out} is the current folder or one above it, which a run replaces whole",
            "pass --out a new folder, for instance ./calibrated",
            "path.unwritable",
        )
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise EdgeAgentError(
                f"output {out} exists and is not a folder", _FIX, "path.unwritable"
            )
        # The whole folder is replaced: never do that to a folder we did not write.
        if any(out.iterdir()) and not (out / REPORT).is_file():
            raise EdgeAgentError(
                f"output folder {out} holds files that are not a calibration output",
                "pass an empty or new folder, or a previous calibration's output",
                "path.unwritable",
            )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _sweep(out)
        return _sibling(out, _staging_prefix(out))
    except OSError as exc:
        raise EdgeAgentError(
            f"cannot write calibration output {out}: {exc.strerror or exc}", _FIX, "path.unwritable"
        ) from None


def _holds_cwd(out: Path) -> bool:
    try:
        here = Path.cwd()
    except OSError:  # the current folder was deleted: it is in no folder
        return False
    target = out.resolve()
    return target == here or target in here.parents


def publish(staging: Path, out: Path) -> None:
    """Move the finished `staging` folder to `out`, replacing a previous output."""
    _sync_tree(staging)
    aside: Path | None = None
    if out.exists():
        aside = _sibling(out, _aside_prefix(out))
        out.replace(aside / out.name)
    try:
        staging.replace(out)
    except OSError:
        if aside is not None:
            (aside / out.name).replace(out)  # put the previous output back
        raise
    _sync_dir(out.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _sibling(out: Path, prefix: str) -> Path:
    # Not mkdtemp: its 0700 would become the output's mode; this one follows the umask.
    folder = out.parent / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
    folder.mkdir()
    return folder


def discard(staging: Path) -> None:
    """Remove a staging folder (a failed or abandoned run)."""
    shutil.rmtree(staging, ignore_errors=True)


_LEFTOVER = re.compile(r"^(\d+)-")


def _sweep(out: Path) -> None:
    # A run killed outright (kill -9, power loss) leaves its staging folder behind; one
    # whose process is gone is garbage. A live process's folder is another run's work.
    # Its aside folder is garbage too, unless the kill came between `publish`'s two
    # renames: `out` is then missing and the aside holds the previous output, which goes
    # back (it was deleted, breaking "a failed run leaves the previous output untouched").
    for prefix in (_staging_prefix(out), _aside_prefix(out)):
        for leftover in out.parent.glob(f"{_glob_escape(prefix)}*"):
            match = _LEFTOVER.match(leftover.name[len(prefix) :])
            if match and not _alive(int(match.group(1))):
                previous = leftover / out.name
                if prefix == _aside_prefix(out) and previous.is_dir() and not out.exists():
                    previous.replace(out)
                    _sync_dir(out.parent)
                shutil.rmtree(leftover, ignore_errors=True)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _sync_tree(folder: Path) -> None:
    # The output is state that must survive a power cut right after the rename.
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _sync_dir(folder)


def _sync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
