"""A fake `arecord` on PATH: this machine has no microphone (the one fake the audio tests use)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


def fake_arecord(
    bin_dir: Path,
    raw: Path,
    tail: str = "",
    before: str = "",
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> Path:
    """An `arecord` in `bin_dir` that logs its arguments to `bin_dir/args`, runs the shell
    lines `before`, plays `raw` (S16_LE samples) on stdout, then runs `tail`; put first on
    PATH when `monkeypatch` is given. Returns `bin_dir`."""
    bin_dir.mkdir()
    script = bin_dir / "arecord"
    script.write_text(f'#!/bin/sh\necho "$@" > {bin_dir}/args\n{before}cat {raw}\n{tail}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    if monkeypatch is not None:
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir
