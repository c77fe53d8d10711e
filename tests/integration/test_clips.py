"""The walk video every test, benchmark and the demo build: its frames and its ground truth."""

from __future__ import annotations

from pathlib import Path

import cv2
import pytest

from edge_agent.clips import HEIGHT, PERSON, WIDTH, compose, walk_positions, write_walk
from edge_agent.errors import EdgeAgentError


def test_walk_repeats_to_the_length_asked(tmp_path: Path) -> None:
    walk = walk_positions(3, 6)
    video = write_walk(tmp_path / "walk.avi", empty=3, crossing=6, frames=len(walk) + 5)
    cap = cv2.VideoCapture(str(video.path))
    read = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        assert frame.shape == (HEIGHT, WIDTH, 3)
        read += 1
    cap.release()
    assert read == video.frames == len(walk) + 5
    # Each pass has empty frames on both sides and the person whole in the middle.
    assert video.absent[:3] == [True] * 3
    assert video.absent[len(walk)] is True
    assert any(video.visible[: len(walk)])
    assert not any(a and v for a, v in zip(video.absent, video.visible, strict=True))


def test_person_is_pasted_where_asked() -> None:
    empty, whole = compose(-PERSON - 10), compose(0)
    assert (empty[:, PERSON:] == whole[:, PERSON:]).all()
    assert (empty[:, :PERSON] != whole[:, :PERSON]).any()


def test_unwritable_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError, match="cannot write MJPG") as failed:
        write_walk(tmp_path / "missing" / "walk.avi", empty=1, crossing=2)
    assert failed.value.code == "path.unwritable"
