"""Frame sources on real files and a real (local) MJPEG-over-HTTP camera.

Videos are written with cv2.VideoWriter from scikit-image photos; the stream is
served by `mjpeg_server.MjpegServer`, which can be cut, stalled and restarted to
play a camera on a flaky network.
"""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import cv2
import numpy as np
import numpy.typing as npt
import pytest
from pydantic import TypeAdapter, ValidationError

from edge_agent.pipelines.base import Frame, SourceError
from edge_agent.pipelines.live_sources import LiveSource
from edge_agent.pipelines.sources import (
    CameraSourceSpec,
    FileSource,
    FileSourceSpec,
    FolderSource,
    FolderSourceSpec,
    SourceSpec,
    StreamSourceSpec,
    open_source,
    spec_from_uri,
)
from tests.cli_kit import edge_agent_cli
from tests.integration.mjpeg_server import MjpegServer, free_port

Image = npt.NDArray[np.uint8]
FPS = 25.0
COUNT = 60
T = TypeVar("T")


@pytest.fixture(scope="module")
def small(astronaut: Image) -> Image:
    return np.asarray(cv2.resize(astronaut, (320, 240), interpolation=cv2.INTER_AREA), np.uint8)


def expected_frames(small: Image) -> list[Image]:
    # Each frame is the photo shifted a little further, so frames are told apart by content.
    return [np.roll(small, 4 * i, axis=1) for i in range(COUNT)]


def write_video(path: Path, frames: list[Image], fourcc: str) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*fourcc), FPS, (320, 240))
    assert writer.isOpened(), f"this OpenCV cannot write {fourcc}"
    for frame in frames:
        writer.write(frame)
    writer.release()
    return path


@pytest.fixture
def avi(tmp_path: Path, small: Image) -> Path:
    return write_video(tmp_path / "clip.avi", expected_frames(small), "MJPG")


def truncate(path: Path, keep: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def bounded(fn: Callable[[], T], timeout: float) -> T:
    """Run fn in a thread; fail the test instead of hanging the suite if it blocks."""
    box: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"call did not return within {timeout} s")
    if errors:
        raise errors[0]
    return box[0]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def test_file_reads_every_frame_in_order(avi: Path, small: Image) -> None:
    expected = expected_frames(small)
    source = FileSource(avi)
    frames: list[Frame] = []
    while (frame := source.read()) is not None:
        frames.append(frame)
    assert source.read() is None
    source.close()
    source.close()

    assert [f.index for f in frames] == list(range(COUNT))
    assert [f.ts for f in frames] == pytest.approx([i / FPS for i in range(COUNT)])
    assert source.dropped == 0
    assert all(f.read_s >= 0 for f in frames)
    for frame in frames[1:-1]:
        i = frame.index
        assert frame.image.shape == (240, 320, 3)
        errors = [np.abs(frame.image.astype(int) - expected[j]).mean() for j in (i - 1, i, i + 1)]
        # MJPG is lossy, but the right frame is far closer than its neighbours.
        assert errors[1] < 0.5 * min(errors[0], errors[2])


def test_truncated_avi_ends_with_source_error(avi: Path) -> None:
    source = open_source(FileSourceSpec(path=truncate(avi, 0.5)))
    read: list[Frame] = []

    def drain() -> None:
        while (frame := source.read()) is not None:
            read.append(frame)

    with pytest.raises(SourceError, match=r"ended after \d+ of 60 frames.*truncated"):
        drain()
    assert 0 < len(read) < COUNT
    assert source.read() is None


def test_truncated_mp4_fails_at_open(tmp_path: Path, small: Image) -> None:
    mp4 = write_video(tmp_path / "clip.mp4", expected_frames(small), "mp4v")
    with pytest.raises(SourceError, match="cannot open video") as caught:
        FileSource(truncate(mp4, 0.5))
    assert "ffprobe" in caught.value.fix


def test_missing_or_garbage_file_fails_at_open(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist") as caught:
        FileSource(tmp_path / "nope.mp4")
    assert caught.value.fix
    junk = tmp_path / "junk.avi"
    junk.write_bytes(b"not a video" * 100)
    with pytest.raises(SourceError, match="cannot open video"):
        FileSource(junk)


def test_folder_in_name_order_skips_unreadable(tmp_path: Path, small: Image) -> None:
    frames = expected_frames(small)
    for name, i in (("b.png", 1), ("a.png", 0), ("c.jpg", 2)):
        cv2.imwrite(str(tmp_path / name), frames[i])
    (tmp_path / "b2.jpg").write_bytes(b"\xff\xd8 truncated jpeg")
    source = open_source(FolderSourceSpec(path=tmp_path, fps=10))
    assert isinstance(source, FolderSource)
    got: list[Frame] = []
    while (frame := source.read()) is not None:
        got.append(frame)
    # a, b, b2 (skipped), c: numbered as the frames of a video, each naming its file.
    assert [f.index for f in got] == [0, 1, 2]
    assert [f.ts for f in got] == pytest.approx([0.0, 0.1, 0.2])
    assert [Path(f.source or "").name for f in got] == ["a.png", "b.png", "c.jpg"]
    assert source.skipped == source.dropped == 1
    assert np.array_equal(got[0].image, frames[0])
    assert np.array_equal(got[1].image, frames[1])


def test_folder_empty_or_all_unreadable(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no files match"):
        FolderSource(tmp_path, "*.jpg")
    with pytest.raises(SourceError, match="does not exist"):
        FolderSource(tmp_path / "missing")
    (tmp_path / "x.jpg").write_bytes(b"junk")
    source = FolderSource(tmp_path, "*.jpg")
    with pytest.raises(SourceError, match="none of the 1 files"):
        source.read()
    assert source.read() is None


def test_spec_from_uri_and_discriminated_config(tmp_path: Path) -> None:
    assert spec_from_uri("0") == CameraSourceSpec(device=0)
    assert spec_from_uri("/dev/video2") == CameraSourceSpec(device="/dev/video2")
    assert spec_from_uri("rtsp://cam/1") == StreamSourceSpec(url="rtsp://cam/1")
    assert isinstance(spec_from_uri("https://cam/x.mjpg"), StreamSourceSpec)
    assert spec_from_uri(str(tmp_path)) == FolderSourceSpec(path=tmp_path)
    assert spec_from_uri("clip.mp4") == FileSourceSpec(path=Path("clip.mp4"))

    adapter: TypeAdapter[SourceSpec] = TypeAdapter(SourceSpec)
    spec = adapter.validate_python({"type": "camera", "device": "1", "fps_cap": 5})
    assert spec == CameraSourceSpec(device=1, fps_cap=5)
    with pytest.raises(ValidationError):
        adapter.validate_python({"type": "stream", "url": "ftp://x"})
    with pytest.raises(ValidationError):
        adapter.validate_python({"type": "file", "path": "a.mp4", "fps": 3})
    with pytest.raises(ValidationError):
        StreamSourceSpec(url="rtsp://x", reconnect_min_s=5, reconnect_max_s=1)


@pytest.fixture
def server(small: Image) -> Iterator[MjpegServer]:
    camera = MjpegServer(small, free_port(), fps=FPS)
    camera.start()
    yield camera
    camera.stop()


class States:
    """Collects on_state calls, which come from the reader thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, state: str, detail: str) -> None:
        with self._lock:
            self.seen.append((state, detail))

    def names(self) -> list[str]:
        with self._lock:
            return [s for s, _ in self.seen]


def stream(url: str, states: States, **options: float) -> LiveSource:
    spec = StreamSourceSpec(
        url=url,
        **{"stall_timeout_s": 1.0, "reconnect_min_s": 0.2, "reconnect_max_s": 0.5, **options},
    )
    source = open_source(spec, on_state=states)
    assert isinstance(source, LiveSource)
    return source


def read_frames(source: LiveSource, n: int) -> list[Frame]:
    frames: list[Frame] = []
    for _ in range(n):
        frame = bounded(source.read, 10)
        assert frame is not None
        frames.append(frame)
    return frames


def test_stream_survives_server_restart(server: MjpegServer) -> None:
    states = States()
    source = stream(server.url, states, give_up_after_s=15)
    try:
        frames = read_frames(source, 5)
        assert source.status == "live"
        assert frames[0].image.shape == (240, 320, 3)
        assert [f.index for f in frames] == sorted({f.index for f in frames})
        assert all(a.ts < b.ts for a, b in itertools.pairwise(frames))

        server.stop()
        # Listeners hear of a change just after `status` shows it: wait for what they heard.
        wait_for(lambda: len(states.names()) >= 2, 5, "status reconnecting")
        assert states.names()[:2] == ["live", "reconnecting"]

        server.start()
        wait_for(lambda: source.reconnects >= 1, 10, "a reconnect")
        read_frames(source, 3)
        assert source.status == "live"
        wait_for(lambda: states.names()[-1] == "live", 5, "listener told live")
    finally:
        source.close()


def test_a_stream_that_drops_after_each_frame_backs_off(server: MjpegServer) -> None:
    # A camera at its session limit, or dying, sends a frame and hangs up, every time. One
    # frame once counted as a recovery: the wait never grew, and the source reconnected
    # (and said "lost" upstream) as fast as reconnect_min_s allowed, for ever.
    server.frames_per_connection = 1
    states = States()
    source = stream(
        server.url, states, reconnect_min_s=0.05, reconnect_max_s=3.0, give_up_after_s=60
    )
    try:
        time.sleep(6.0)
        losses = states.names().count("reconnecting")
        # Doubling from 0.05 s: 0.05 + 0.1 + ... + 1.6 is 3.15 s of waiting for six losses.
        assert 2 <= losses <= 9, states.names()
    finally:
        source.close()


def test_stream_gone_for_good_gives_up(server: MjpegServer) -> None:
    states = States()
    source = stream(server.url, states, give_up_after_s=2)
    try:
        read_frames(source, 2)
        server.stop()
        start = time.monotonic()

        def drain() -> None:
            while source.read() is not None:
                pass

        with pytest.raises(SourceError, match="giving up") as caught:
            bounded(drain, 10)
        # Give-up is 2 s after the last frame, plus at most one connect attempt.
        assert time.monotonic() - start < 2 + 1 + 1.5
        assert source.status == "failed"
        assert states.names()[-1] == "failed"
        assert "ffprobe" in caught.value.fix
        with pytest.raises(SourceError):
            source.read()
    finally:
        source.close()


def test_a_stream_whose_every_jpeg_is_corrupt_gives_up(server: MjpegServer) -> None:
    # Each JPEG cut short by two bytes (its end marker), as firmware with a bad
    # Content-Length sends them: OpenCV decodes none. Packets kept arriving, so the give-up,
    # keyed to them, never came: the pipeline sat "live" with no frame and no error.
    server.jpeg = server.jpeg[:-2]
    states = States()
    source = stream(server.url, states, give_up_after_s=2)
    try:
        start = time.monotonic()
        with pytest.raises(SourceError, match="every frame it sent was a corrupt JPEG"):
            bounded(source.read, 10)
        assert time.monotonic() - start < 2 + 1.5
        assert source.status == "failed"
        assert source.dropped > 10  # each corrupt packet counted as lost
    finally:
        source.close()


def test_a_camera_that_never_answers_gives_up_on_time_in_its_own_words() -> None:
    # It takes the connection and never says a word: each connect takes two opens (hardware
    # decode asked, then plain) of a stall timeout each. A connect started at the give-up,
    # when the backoff outlasted what was left, ran past the read's backstop: the camera
    # failed late, blamed on "reader blocked in the backend".
    mute = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []
    accepting = threading.Thread(
        target=lambda: taken.extend(mute.accept()[0] for _ in iter(int, 1)), daemon=True
    )
    accepting.start()
    port = mute.getsockname()[1]
    spec = StreamSourceSpec(
        url=f"http://127.0.0.1:{port}/video.mjpg",
        hw_decode=True,
        stall_timeout_s=1.0,
        reconnect_min_s=5.0,
        reconnect_max_s=5.0,
        give_up_after_s=2.5,
    )
    source = open_source(spec)
    try:
        start = time.monotonic()
        with pytest.raises(SourceError) as caught:
            bounded(source.read, 20)
        assert time.monotonic() - start < 2.5 + 1.0
        assert "reader blocked" not in str(caught.value)
        assert "answers, but sends no stream" in str(caught.value)
    finally:
        source.close()
        mute.close()
        for connection in taken:
            connection.close()


def test_a_dead_host_costs_one_open_a_connect_with_hardware_decode_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The open with hardware decode failed, and the same URL was opened again without it:
    # on a powered-off camera, two opens of up to the stall timeout every reconnect. A
    # host that does not answer TCP fails the plain open as well; it is not tried.
    real = cv2.VideoCapture
    opens: list[str] = []

    def counting(*args: object) -> cv2.VideoCapture:
        if args:
            opens.append(str(args[0]))
        return real(*args)

    # Every connect that fails probes the host once, to say why: one probe, one connect.
    real_connect = socket.create_connection
    probes: list[object] = []

    def probing(address: tuple[str, int], *args: object, **kwargs: object) -> socket.socket:
        probes.append(address)
        return real_connect(address, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cv2, "VideoCapture", counting)
    monkeypatch.setattr(socket, "create_connection", probing)
    url = f"http://127.0.0.1:{free_port()}/video.mjpg"  # nothing listens there
    spec = StreamSourceSpec(
        url=url, hw_decode=True, reconnect_min_s=0.2, reconnect_max_s=0.2, give_up_after_s=1.0
    )
    source = open_source(spec)
    try:
        with pytest.raises(SourceError, match="connection refused") as caught:
            bounded(source.read, 10)
        assert "hw decode" not in str(caught.value)
    finally:
        source.close()
    assert probes, "the source never connected"
    assert opens.count(url) == len(probes), (len(opens), len(probes))


def test_stalled_stream_counts_as_loss(server: MjpegServer) -> None:
    states = States()
    source = stream(server.url, states, give_up_after_s=15)
    try:
        read_frames(source, 3)
        server.stalled.set()
        # The listener is told after `status` changes, on the reader's thread: wait for it.
        wait_for(lambda: "reconnecting" in states.names(), 4, "stall detected")
        detail = next(d for s, d in states.seen if s == "reconnecting")
        assert "sent nothing for 1 s" in detail
        server.stalled.clear()
        wait_for(lambda: source.reconnects >= 1, 8, "a reconnect after the stall")
        read_frames(source, 2)
    finally:
        source.close()


def test_slow_consumer_gets_latest_frame_and_cap_limits_rate(server: MjpegServer) -> None:
    slow = stream(server.url, States())
    capped = stream(server.url, States(), fps_cap=5)
    try:
        read_frames(slow, 1)
        time.sleep(0.5)
        late = read_frames(slow, 1)[0]
        # ~12 frames arrived while we slept; only the newest is handed over.
        assert slow.dropped >= 5
        assert late.index >= 6

        read_frames(capped, 1)
        dropped = capped.dropped  # frames that waited while we read `slow`
        start = time.monotonic()
        delivered = len(read_frames(capped, 5))
        elapsed = time.monotonic() - start
        assert delivered / elapsed < 6.5
        assert capped.capped >= 10
        # A consumer that keeps up with the capped rate loses nothing.
        assert capped.dropped == dropped
    finally:
        slow.close()
        capped.close()


def test_close_is_prompt_and_ends_reads(server: MjpegServer) -> None:
    source = stream(server.url, States())
    read_frames(source, 1)
    start = time.monotonic()
    source.close()
    source.close()
    assert time.monotonic() - start < 2.5
    assert source.read() is None


def test_missing_camera_gives_up_with_the_reason() -> None:
    states = States()
    source = open_source(CameraSourceSpec(device="/dev/video99", give_up_after_s=1), states)
    try:
        with pytest.raises(SourceError, match="/dev/video99 does not exist") as caught:
            bounded(source.read, 8)
        assert "v4l2-ctl" in caught.value.fix
        assert states.names() == ["reconnecting", "failed"]
    finally:
        source.close()


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    proc = edge_agent_cli("run-pipeline", *args, "--json", timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, [json.loads(line) for line in proc.stdout.splitlines()]


def test_folder_lines_name_their_file_and_skips_are_counted(tmp_path: Path, small: Image) -> None:
    frames = expected_frames(small)
    folder = tmp_path / "shots"
    folder.mkdir()
    for name, i in (("a.png", 0), ("c.png", 1), ("e.jpg", 2)):
        cv2.imwrite(str(folder / name), frames[i])
    (folder / "b.jpg").write_bytes(b"\xff\xd8 truncated jpeg")
    (folder / "d.png").write_bytes(b"")
    proc, lines = run_cli("--model", "person-ssdlite", "--source", str(folder))
    assert proc.returncode == 0, proc.stderr
    *frame_lines, summary = lines
    assert [ln["frame"] for ln in frame_lines] == [0, 1, 2]
    assert [ln["source"] for ln in frame_lines] == [
        str(folder / n) for n in ("a.png", "c.png", "e.jpg")
    ]
    assert summary["summary"]["dropped"] == 2  # type: ignore[index]
    # Each skipped file is said once, with why.
    skipped = [ln for ln in proc.stderr.splitlines() if "image_skipped" in ln]
    assert len(skipped) == 2
    assert ("b.jpg" in skipped[0], "not an image" in skipped[0]) == (True, True), skipped
    assert ("d.png" in skipped[1], "empty file" in skipped[1]) == (True, True), skipped


def closed_port() -> int:
    # Nothing listens there, and it is outside the ephemeral range, so no connection of
    # this machine's (nor the client's own, connecting to itself) can hold it meanwhile.
    return free_port()


def test_unreachable_stream_is_said_once_in_our_words(tmp_path: Path) -> None:
    spec = tmp_path / "cam.toml"
    spec.write_text(
        f"""
id = "cam"
sinks = []
[model]
name = "person-ssdlite"
[source]
type = "stream"
url = "rtsp://127.0.0.1:{closed_port()}/live"
give_up_after_s = 1.0
reconnect_min_s = 0.2
stall_timeout_s = 1.0
"""
    )
    proc, _ = run_cli(str(spec))
    assert proc.returncode != 0
    # FFmpeg's and OpenCV's own lines are muted...
    for noise in ("[tcp @", "VIDEOIO", "WARN:", "[rtsp @"):
        assert noise not in proc.stderr, proc.stderr
    # ...and the reason is given in ours, ending in one error line.
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("edge-agent: error:")]
    assert len(errors) == 1
    assert "connection refused" in errors[0]
