"""What each step of the cheap decode path buys: reduced JPEG decode, resize, raw MJPEG packets.

For camera-sized JPEGs (1920x1080 and 1280x720, built from scikit-image photos), the
time per frame to decode it whole and resize to person-ssdlite's 300x300 input, against
decoding it at 1/2, 1/4 and 1/8 (cv2.IMREAD_REDUCED_COLOR_*) and resizing what is left;
the reduction edge-agent picks for that input is marked. For a 640x480 MJPG video: FFmpeg's
own decode against reading JPEG packets (raw mode) and decoding them with cv2.imdecode,
whole and at 1/2: whole, the packet path is no slower, which is why an MJPEG source decoded
on the CPU always reads packets (and a source that drops frames never decodes them). Last, whether
OpenCV's FFmpeg has a hardware decoder here.

The packet rows run after the large JPEGs, and that matters: until a process has freed a
buffer larger than about 1 MB, glibc maps each decoded 640x480 frame fresh and faults its
pages in, which doubles the cost of a whole-frame cv2.imdecode (1.8 ms against 0.9 ms here;
MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set high do the same as the warm-up).
FFmpeg's decoder pools its buffers and does not pay it.

Every figure is the median of a few rounds, printed beside the 1-minute load average and the
CPU flags; figures are noisy while anything else runs. About 10 seconds:

    python tools/bench_decode.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
from benchlib import consoles, cpu_flags, flags_text, load_1m, print_machine
from rich.table import Table

from edge_agent.clips import bgr, compose, sample, walk_positions
from edge_agent.pipelines.decode import min_size_for_fit, open_capture, reduction_for

MODEL = (300, 300)
FLAGS = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}


def per_call_ms(step: Callable[[], object], rounds: int, calls: int) -> float:
    """Median over rounds of the mean milliseconds per call."""
    step()  # warm: first calls allocate
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def camera_jpeg(size: tuple[int, int]) -> np.ndarray:
    scene = cv2.resize(bgr(sample("coffee")), size, interpolation=cv2.INTER_CUBIC)
    person = bgr(sample("astronaut"))
    side = size[1] // 2
    scene[size[1] - side :, size[0] // 3 : size[0] // 3 + side] = cv2.resize(person, (side, side))
    ok, data = cv2.imencode(".jpg", scene, [cv2.IMWRITE_JPEG_QUALITY, 85])
    assert ok
    return np.asarray(data)


def jpeg_rows(table: Table, rounds: int) -> None:
    for size in ((1920, 1080), (1280, 720)):
        data = camera_jpeg(size)
        picked = reduction_for(size, min_size_for_fit(MODEL, "stretch")(size))
        for k, flag in FLAGS.items():

            def decode_only(flag: int = flag, data: np.ndarray = data) -> object:
                return cv2.imdecode(data, flag)

            def decode_resize(flag: int = flag, data: np.ndarray = data) -> object:
                image = np.asarray(cv2.imdecode(data, flag))
                return cv2.resize(image, MODEL, interpolation=cv2.INTER_LINEAR)

            mark = " (picked for 300x300)" if k == picked else ""
            table.add_row(
                f"{size[0]}x{size[1]} JPEG at 1/{k}{mark}",
                f"{per_call_ms(decode_only, rounds, 20):.2f}",
                f"{per_call_ms(decode_resize, rounds, 20):.2f}",
                f"{load_1m():.2f}",
            )


def video_rows(table: Table, rounds: int, folder: Path) -> None:
    path = folder / "walk.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 15.0, (640, 480))
    for x in walk_positions(5, 25)[:60]:
        writer.write(compose(x))
    writer.release()

    def read_all(raw: bool, flag: int | None) -> float:
        cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
        if raw:
            cap.set(cv2.CAP_PROP_FORMAT, -1)
        frames = 0
        start = time.perf_counter()
        while True:
            ok, data = cap.read()
            if not ok:
                break
            if flag is not None:
                cv2.imdecode(data.reshape(-1), flag)
            frames += 1
        cap.release()
        return (time.perf_counter() - start) / max(frames, 1) * 1e3

    for name, raw, flag in (
        ("640x480 MJPG: FFmpeg decode", False, None),
        ("640x480 MJPG: packets + imdecode whole", True, cv2.IMREAD_COLOR),
        ("640x480 MJPG: packets + imdecode 1/2", True, cv2.IMREAD_REDUCED_COLOR_2),
        ("640x480 MJPG: packets only (no decode)", True, None),
    ):
        ms = statistics.median(read_all(raw, flag) for _ in range(rounds))
        table.add_row(name, f"{ms:.2f}", "", f"{load_1m():.2f}")
    _, hw, note = open_capture(str(path), [], hw_decode=True)
    table.caption = f"{flags_text(cpu_flags())}\nhardware video decode: {hw} {note}".strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per figure")
    args = parser.parse_args()
    out, _ = consoles(120)
    print_machine(out, {"opencv": cv2.__version__})
    table = Table(title="decode path, ms per frame (median of rounds)")
    for column in ("step", "decode ms", "decode + resize to 300x300 ms", "load 1m"):
        table.add_column(column, justify="left" if column == "step" else "right")
    jpeg_rows(table, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        video_rows(table, args.rounds, Path(tmp))
    out.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
