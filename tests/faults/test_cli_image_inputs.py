"""Image and video files a user can hand the CLI that used to crash it or be misnamed.

An image over OpenCV's pixel limit raised a traceback; a file name that is not UTF-8
segfaulted OpenCV with no word at all; a truncated JPEG was accepted by `infer` while a
folder source rejected it; /dev/null, a file given as a folder and a folder given as a
model were all said not to exist. Each is now one `error: problem; fix [code]` line and
exit 2, or, in a folder or a calibration set, one skipped image.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge_agent.catalog.manifest import ImageInput, load_manifest
from edge_agent.pipelines.decode import IMAGE_FILE_TOO_LARGE
from edge_agent.pipelines.file_sources import FolderSource
from edge_agent.quantize.data import load_frames
from tests.cli_kit import edge_agent_cli, one_line_error
from tests.conftest import REPO, bgr, sample

pytestmark = pytest.mark.usefixtures("cache_dir")

MODEL = "text-orientation"  # a small image model: these are about the input, not the model


def oversized_png(path: Path, side: int = 40000) -> Path:
    """A `side` x `side` PNG header over 8 x 8 pixels of data: OpenCV checks the declared
    size before it decodes, so this is what a 1.5 MB all-black 40000 x 40000 PNG meets."""
    ok, encoded = cv2.imencode(".png", np.zeros((8, 8), np.uint8))
    assert ok
    data = bytearray(encoded.tobytes())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", side, side)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))
    return path


def jpeg_bytes() -> bytes:
    ok, encoded = cv2.imencode(".jpg", bgr(sample("astronaut")))
    assert ok
    return encoded.tobytes()


def truncated_jpeg(path: Path) -> Path:
    path.write_bytes(jpeg_bytes()[:700])  # headers and a few rows: libjpeg warns, fills grey
    return path


def non_utf8(folder: Path, name: bytes) -> Path:
    """A path in `folder` whose last part is `name`, bytes that are not valid UTF-8."""
    return Path(os.fsdecode(os.fsencode(folder) + b"/" + name))


def infer(image: Path, model: str = MODEL) -> subprocess.CompletedProcess[str]:
    return edge_agent_cli("infer", "--model", model, "--input", str(image), "--no-cache")


def test_an_oversized_image_is_one_line_for_infer(tmp_path: Path) -> None:
    proc = infer(oversized_png(tmp_path / "bomb.png"))
    assert one_line_error(proc, "bomb.png", "too large") == "input.unreadable"


def test_an_image_over_the_agents_pixel_limit_is_refused_before_it_is_decoded(
    tmp_path: Path,
) -> None:
    # 9000 x 9000 is under OpenCV's own 2^30, which let it allocate 243 MB for the frame
    # (32768 x 32768 in a 1 MB PNG: 3 GB); edge-agent holds it to 2^26 pixels.
    proc = infer(oversized_png(tmp_path / "bomb.png", side=9000))
    assert one_line_error(proc, "bomb.png", "too large") == "input.unreadable"


def test_a_truncated_jpeg_is_refused_by_infer_as_by_a_folder(tmp_path: Path) -> None:
    # infer used to run it (libjpeg's "Premature end of JPEG file" on stderr, exit 0).
    proc = infer(truncated_jpeg(tmp_path / "trunc.jpg"))
    assert one_line_error(proc, "trunc.jpg", "cannot decode") == "input.unreadable"
    assert "Premature" not in proc.stderr


def test_an_image_named_in_another_encoding_is_read(tmp_path: Path) -> None:
    # cv2.imread segfaulted on it: exit 139, nothing said.
    image = non_utf8(tmp_path, b"bad\xffname.jpg")
    image.write_bytes(jpeg_bytes())
    proc = infer(image)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert any("label" in r for r in results), proc.stdout


def test_a_video_named_in_another_encoding_is_one_line(tmp_path: Path) -> None:
    # cv2.VideoCapture takes only a path, and segfaulted on this one: refused by name.
    clip = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter.fourcc(*"MJPG"), 10, (64, 48))
    for _ in range(3):
        writer.write(np.zeros((48, 64, 3), np.uint8))
    writer.release()
    renamed = non_utf8(tmp_path, b"v\xff.avi")
    clip.rename(renamed)
    proc = edge_agent_cli(
        "run-pipeline", "--model", MODEL, "--source", str(renamed), "--max-frames", "2"
    )
    assert one_line_error(proc, "not valid UTF-8", "rename") == "input.invalid"


def test_dev_null_is_not_said_to_be_missing() -> None:
    proc = infer(Path("/dev/null"))
    assert one_line_error(proc, "is not a regular file") == "input.invalid"
    assert "does not exist" not in proc.stderr


def test_an_empty_image_is_said_to_be_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jpg"
    empty.touch()
    proc = infer(empty)
    assert one_line_error(proc, "is empty") == "input.unreadable"


def test_a_model_folder_is_named_as_a_folder(tmp_path: Path) -> None:
    image = tmp_path / "photo.jpg"
    image.write_bytes(jpeg_bytes())
    proc = infer(image, model=str(tmp_path))
    assert one_line_error(proc, "is a folder", "model file") == "input.invalid"
    assert "does not exist" not in proc.stderr


def test_a_folder_spec_naming_a_file_is_named_as_a_file(tmp_path: Path) -> None:
    image = tmp_path / "photo.jpg"
    image.write_bytes(jpeg_bytes())
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'id = "dock"\n[model]\nname = "{MODEL}"\n[source]\ntype = "folder"\npath = "{image}"\n'
    )
    proc = edge_agent_cli("run-pipeline", str(spec))
    assert one_line_error(proc, "is a file, not a folder") == "input.invalid"


def test_a_folder_skips_and_counts_oversized_and_truncated_images(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The oversized one used to stop the pipeline with an [internal] error.
    oversized_png(tmp_path / "a.png")
    truncated_jpeg(tmp_path / "b.jpg")
    (tmp_path / "c.jpg").write_bytes(jpeg_bytes())
    source = FolderSource(tmp_path)
    frames = []
    while (frame := source.read()) is not None:
        frames.append(frame)
    assert [Path(f.source or "").name for f in frames] == ["c.jpg"]
    assert source.skipped == 2
    # Why each was skipped is in the log; libjpeg's own complaint is not on stderr besides.
    assert "Premature" not in capfd.readouterr().err


def test_calibration_passes_over_oversized_images(tmp_path: Path) -> None:
    oversized_png(tmp_path / "a.png")
    truncated_jpeg(tmp_path / "b.jpg")
    (tmp_path / "c.jpg").write_bytes(jpeg_bytes())
    image = non_utf8(tmp_path, b"d\xff.jpg")
    image.write_bytes(jpeg_bytes())
    spec = image_input()
    frames = load_frames(tmp_path, 10, spec)
    assert len(frames) == 2
    assert all(f.shape == (spec.height, spec.width, 3) for f in frames)


def image_input() -> ImageInput:
    spec = load_manifest(REPO / "models" / f"{MODEL}.toml").input
    assert isinstance(spec, ImageInput)
    return spec


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk: what a runaway recorder, or anyone with
    write access to the folder, can leave among the images."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


def peak_bytes(work: Callable[[], Any]) -> int:
    """The most memory Python and numpy held at once while `work` ran."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def skip_reasons(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    skipped = [vars(r)["fields"] for r in caplog.records if r.getMessage() == "image_skipped"]
    return {Path(fields["path"]).name: fields["reason"] for fields in skipped}


def folder_frames(folder: Path) -> tuple[list[str], int]:
    source = FolderSource(folder)
    names = []
    while (frame := source.read()) is not None:
        names.append(Path(frame.source or "").name)
    return names, source.skipped


def test_a_folder_skips_a_huge_file_without_reading_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # It used to be read whole: 1 GiB of memory for a file no camera writes, and again at
    # every restart of an agent that restores the pipeline.
    sparse(tmp_path / "a.jpg", 1 << 30)
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    caplog.set_level(logging.WARNING, logger="edge_agent.pipelines.file_sources")
    found: list[tuple[list[str], int]] = []
    peak = peak_bytes(lambda: found.append(folder_frames(tmp_path)))
    assert found == [(["b.jpg"], 1)]
    assert skip_reasons(caplog) == {"a.jpg": IMAGE_FILE_TOO_LARGE}
    assert peak < 64 << 20, f"{peak >> 20} MiB held to read one 512 x 512 JPEG"


def test_a_folder_reads_no_more_than_the_limit_of_a_file_longer_than_it_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # /proc/self/pagemap is a regular file of size 0 that reads on for gigabytes: what a
    # file growing between its size check and its read looks like, every time.
    (tmp_path / "a.jpg").symlink_to("/proc/self/pagemap")
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    caplog.set_level(logging.WARNING, logger="edge_agent.pipelines.file_sources")
    assert folder_frames(tmp_path) == (["b.jpg"], 1)
    assert skip_reasons(caplog) == {"a.jpg": IMAGE_FILE_TOO_LARGE}


def test_calibration_passes_over_a_huge_file_without_reading_it(tmp_path: Path) -> None:
    sparse(tmp_path / "a.jpg", 1 << 30)
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    found: list[int] = []
    peak = peak_bytes(lambda: found.append(len(load_frames(tmp_path, 10, image_input()))))
    assert found == [1]
    assert peak < 64 << 20, f"{peak >> 20} MiB held to read one 512 x 512 JPEG"


def test_calibration_refuses_a_video_named_in_another_encoding(tmp_path: Path) -> None:
    # Run as a user would: on the old code this was a segfault, which would end pytest.
    video = non_utf8(tmp_path, b"v\xff.avi")
    video.write_bytes(b"\x00" * 1024)
    proc = edge_agent_cli("calibrate", "--model", MODEL, "--data", str(video))
    assert one_line_error(proc, "not valid UTF-8") == "input.invalid"
