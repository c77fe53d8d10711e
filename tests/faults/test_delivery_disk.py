"""A deploy the state disk cannot take is refused up front, and one that fills it leaves
no partial behind.

A pull that ran out of space kept its partial transfer for a resume: the state disk (the
outbox, the records, the store) stayed 100% full until a deploy of that name, or for 14
days. Nothing looked at the free space first, though the release gives its size.
"""

from __future__ import annotations

import dataclasses
import os
import resource
from pathlib import Path

import pytest

from edge_agent.delivery.pull import pull
from edge_agent.errors import EdgeAgentError
from edge_agent.paths import Layout
from edge_agent.store.store import ModelStore
from tests.broker import FAST, AfterFrames, Fleet, device_session
from tests.disk_kit import files_capped_at


def test_a_pull_the_disk_cannot_take_is_refused_before_any_transfer(
    fleet: Fleet, tmp_path: Path
) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    stat = os.statvfs(tmp_path)
    free = stat.f_bavail * stat.f_frsize
    # The disk's real free space, asked to stay free with a GiB to spare: no room is left.
    options = dataclasses.replace(FAST, keep_free_bytes=free + 2**30)
    device = device_session(fleet.broker)
    counted = AfterFrames(device, 1, lambda: None)
    try:
        with pytest.raises(EdgeAgentError) as err:
            pull(
                counted,
                ModelStore(layout),
                layout,
                "orient",
                device_id="dev-1",
                trusted_keys=[fleet.key.public_key()],
                options=options,
            )
    finally:
        device.stop()
    assert err.value.code == "path.unwritable"
    size = fleet.signed.release.total_size / 2**20
    assert f"needs {size:.1f} MiB" in err.value.problem
    assert "free space" in err.value.fix
    assert counted.seen == 0, "not one chunk was taken"
    assert not layout.transfers.exists() or not any(layout.transfers.iterdir())


def test_a_pull_that_fills_the_disk_removes_its_partial(fleet: Fleet, tmp_path: Path) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def disk_fills() -> None:
        # The files are already at full size (sparse): from here no chunk past the first
        # 64 KiB of a file can be written, as on a disk that just filled.
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))

    device = device_session(fleet.broker)
    try:
        with files_capped_at(hard), pytest.raises(EdgeAgentError) as err:
            pull(
                AfterFrames(device, 5, disk_fills),
                ModelStore(layout),
                layout,
                "orient",
                device_id="dev-1",
                trusted_keys=[fleet.key.public_key()],
                options=FAST,
            )
    finally:
        device.stop()
    assert err.value.code == "transfer.failed"
    assert "cannot store orient v1" in err.value.problem
    assert "removed" in err.value.fix
    assert not any(layout.transfers.iterdir()), "the partial went with the failed pull"
