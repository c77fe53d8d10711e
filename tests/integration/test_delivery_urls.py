"""Releases whose files name a URL: downloaded with Range, resumed, and never stuck.

A real HTTP server on loopback serves the reference model text-orientation (52 chunks)
as a mirror would, or as a broken one does: trickling a byte at a time, serving other
bytes, or cutting a chunked body short. The fleet server and mosquitto serve the same
release over MQTT, which takes over whatever the URL did not give.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import Will, connect
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.delivery.partial import PartialTransfer
from edge_agent.delivery.pull import PullOptions, PullResult, pull
from edge_agent.delivery.puller import PullerOptions
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet.publish import publish_release
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer
from edge_agent.paths import Layout
from edge_agent.store.release import SignedRelease, build_release, generate_key, sign
from edge_agent.store.store import ModelStore
from tests.broker import TOPICS, broker_settings, device_session

OPTIONS = PullOptions(
    release_timeout_s=5.0,
    stall_s=2.0,
    url_timeout_s=30.0,  # longer than every test: a socket timeout must not be what ends it
    puller=PullerOptions(idle_s=0.5, repair_timeout_s=1.0),
)


@dataclass
class Mirror:
    """What the HTTP server does with each request; the requests it saw."""

    body: bytes
    mode: str = "ok"
    requests: list[str] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)
    before_body: Callable[[], None] = lambda: None


def _handler(mirror: Mirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            ranged = self.headers.get("Range", "")
            mirror.requests.append(ranged)
            start, end = 0, len(mirror.body) - 1
            if ranged.startswith("bytes=") and mirror.mode != "ignore-range":
                first, _, last = ranged[6:].partition("-")
                start, end = int(first), int(last or end)
            body = mirror.body[start : end + 1]
            if mirror.mode == "chunked-garbage":
                self.send_response(206)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"20000\r\n" + body[: 128 * 1024] + b"\r\nzz\r\n")
                return
            self.send_response(200 if mirror.mode == "ignore-range" else 206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(mirror.body)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            mirror.before_body()
            if mirror.mode == "trickle":
                # A byte every 0.1 s: each read well inside any socket timeout.
                for i in range(len(body)):
                    if mirror.halt.wait(0.1):
                        return
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                return
            if mirror.mode == "wrong-from-3":
                cut = 3 * 128 * 1024 - start
                body = body[:cut] + bytes(len(body) - cut) if cut > 0 else bytes(len(body))
            self.wfile.write(body)

    return Handler


@dataclass
class UrlFleet:
    broker: LocalBroker
    signed: SignedRelease
    mirror: Mirror
    key_public: Ed25519PublicKey

    @property
    def chunks(self) -> int:
        return sum(len(f.chunks) for f in self.signed.release.files)


@contextmanager
def _fleet(
    broker: LocalBroker,
    tmp_path: Path,
    resolve: Callable[[str], ResolvedModel],
    url: str,
    mirror: Mirror,
) -> Iterator[UrlFleet]:
    """text-orientation published as `orient` v1 with its file at `url`, served over MQTT
    by a fleet server too."""
    model = resolve("text-orientation")
    release = build_release(
        name="orient",
        version=1,
        folder=model.path.parent,
        files=[model.path.name],
        model=model.path.name,
        manifest=model.manifest,
    )
    files = [f.model_copy(update={"url": url}) for f in release.files]
    key = generate_key()
    signed = sign(release.model_copy(update={"files": files}), key)
    session = connect(
        broker_settings(broker), will=lambda: Will(TOPICS.server("s1"), b"", retain=True)
    )
    fleet = FleetServer(session, Repo(tmp_path / "repo"), instance="s1")
    fleet.start()
    publish_release(session, TOPICS, fleet.repo, signed, model.path.parent)
    assert session.flush(5.0)
    stop = threading.Event()
    runner = threading.Thread(target=fleet.run, args=(stop,), daemon=True)
    runner.start()
    try:
        yield UrlFleet(broker, signed, mirror, key.public_key())
    finally:
        mirror.halt.set()
        stop.set()
        runner.join(5.0)
        session.stop()


@pytest.fixture
def url_fleet(
    broker: LocalBroker, tmp_path: Path, resolve: Callable[[str], ResolvedModel]
) -> Iterator[UrlFleet]:
    model = resolve("text-orientation")
    mirror = Mirror(body=model.path.read_bytes())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(mirror))
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{model.path.name}"
    try:
        with _fleet(broker, tmp_path, resolve, url, mirror) as fleet:
            yield fleet
    finally:
        server.shutdown()
        server.server_close()


def _pull(fleet: UrlFleet, layout: Layout, cancel: threading.Event | None = None) -> PullResult:
    device = device_session(fleet.broker)
    try:
        return pull(
            device,
            ModelStore(layout),
            layout,
            "orient",
            device_id="dev-1",
            trusted_keys=[fleet.key_public],
            cancel=cancel,
            options=OPTIONS,
        )
    finally:
        device.stop()


def _open_fds() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


def test_the_url_gives_every_chunk_and_mqtt_none(url_fleet: UrlFleet, tmp_path: Path) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    result = _pull(url_fleet, layout)
    assert result.installed
    assert result.stats.frames == 0  # nothing came over MQTT
    assert url_fleet.mirror.requests == [f"bytes=0-{len(url_fleet.mirror.body) - 1}"]
    assert ModelStore(layout).installed("orient", 1) is not None


def test_a_mirror_that_trickles_is_left_for_mqtt(url_fleet: UrlFleet, tmp_path: Path) -> None:
    # A byte every 0.1 s never trips a socket timeout; it held the pull for days.
    url_fleet.mirror.mode = "trickle"
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    started = time.monotonic()
    result = _pull(url_fleet, layout)
    assert result.installed
    assert result.stats.stored == url_fleet.chunks  # all of it over MQTT
    assert time.monotonic() - started < 25.0


def test_a_cancel_stops_a_download_that_trickles(url_fleet: UrlFleet, tmp_path: Path) -> None:
    url_fleet.mirror.mode = "trickle"
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(EdgeAgentError) as caught:
        _pull(url_fleet, layout, cancel)
    assert caught.value.code == "command.cancelled"
    assert time.monotonic() - started < 1.5  # within a tick of the cancel, not a stall_s
    # And the download ends with it, at its next read: it read on to the end of its chunk
    # (a byte every 29 s makes that 44 days), one thread and socket per cancelled pull.
    deadline = time.monotonic() + 2.0
    while _downloading() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _downloading()


def _downloading() -> bool:
    return any(t.name == "url-fetch" for t in threading.enumerate())


def test_a_resume_from_a_mirror_that_ignores_range(url_fleet: UrlFleet, tmp_path: Path) -> None:
    # The first 10 chunks are held; the mirror answers the Range request with the whole
    # file (200): the download reads past what is held, and takes the rest from there.
    url_fleet.mirror.mode = "ignore-range"
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    rid = ChunkMap(url_fleet.signed.release).id
    partial = PartialTransfer(layout.transfers / f"orient-1-{rid}", url_fleet.signed)
    for ref in partial.chunks.refs[:10]:
        assert partial.write(ref.index, url_fleet.mirror.body[ref.offset : ref.offset + ref.length])
    partial.close()
    result = _pull(url_fleet, layout)
    assert result.installed
    assert result.stats.frames == 0  # all from the mirror
    assert url_fleet.mirror.requests == [
        f"bytes={10 * 128 * 1024}-{len(url_fleet.mirror.body) - 1}"
    ]


def test_a_file_url_naming_a_fifo_is_left_for_mqtt(
    broker: LocalBroker, tmp_path: Path, resolve: Callable[[str], ResolvedModel]
) -> None:
    # Opened blocking, a FIFO's open never returned: no stop could end that thread.
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    with _fleet(broker, tmp_path, resolve, fifo.as_uri(), Mirror(body=b"")) as fleet:
        layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
        result = _pull(fleet, layout)
    assert result.installed
    assert result.stats.stored == fleet.chunks  # all of it over MQTT
    assert not _downloading()


def test_a_mirror_serving_other_bytes_keeps_the_good_chunks(
    url_fleet: UrlFleet, tmp_path: Path
) -> None:
    # Chunks 0-2 are right, 3 on are not: the three verified are kept, and MQTT gives
    # the rest. The whole transfer used to be thrown away as transfer.digest.
    url_fleet.mirror.mode = "wrong-from-3"
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    result = _pull(url_fleet, layout)
    assert result.installed
    assert result.stats.stored == url_fleet.chunks - 3


def test_a_body_cut_short_leaks_nothing_and_mqtt_finishes(
    url_fleet: UrlFleet, tmp_path: Path
) -> None:
    # A chunked body whose second chunk size is not hex: http.client raises IncompleteRead,
    # which is no OSError, and escaped as an internal error with the partial's files open.
    url_fleet.mirror.mode = "chunked-garbage"
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    before = _open_fds()
    result = _pull(url_fleet, layout)
    assert result.installed
    assert result.stats.stored == url_fleet.chunks - 1  # the first came whole from the URL
    assert _open_fds() <= before


def test_a_disk_that_fills_during_the_download_removes_the_partial(
    url_fleet: UrlFleet, tmp_path: Path
) -> None:
    # The disk fills once the download began (tests/disk_kit.py's cap, set before it,
    # would fail the sparse files' ftruncate instead). The error hid its OSError, so the
    # pull kept the partial for a resume, and with it the disk full for 14 days.
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as files_capped_at does
    cap = (1024 * 1024, hard)
    url_fleet.mirror.before_body = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, cap)
    try:
        with pytest.raises(EdgeAgentError) as caught:
            _pull(url_fleet, layout)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert caught.value.code == "transfer.failed"
    assert "free space" in caught.value.fix
    assert list(layout.transfers.iterdir()) == []  # not left holding the disk full
