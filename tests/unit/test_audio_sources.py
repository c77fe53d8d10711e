"""Audio sources: the ring buffer, WAV files cut into chunks, and arecord capture.

There is no microphone here, so the mic tests put a fake `arecord` first on PATH:
a shell script that records its arguments and `cat`s raw S16 samples of a sine.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import tracemalloc
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from edge_agent.agent.pipelines import parse_spec
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines import audio_sources
from edge_agent.pipelines.audio_sources import (
    MicSource,
    MicSourceSpec,
    RingBuffer,
    WavSourceSpec,
    open_audio_source,
)
from edge_agent.pipelines.base import AudioChunk, AudioSource, SourceError
from tests.mic_kit import fake_arecord

RATE = 16000
HOP = 512


def sine(freq: float, seconds: float, rate: int) -> npt.NDArray[np.float32]:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def s16(samples: npt.NDArray[np.float32]) -> bytes:
    return (samples * 32767).round().astype("<i2").tobytes()


def peak_hz(samples: npt.NDArray[np.float32], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.argmax(spectrum) * rate / len(samples))


def test_ring_buffer_fifo_wraps_and_overwrites_oldest() -> None:
    ring = RingBuffer(5)
    assert ring.read(1) is None
    ring.write(np.array([1, 2, 3], dtype=np.float32))
    assert ring.available == 3
    assert ring.read(4) is None
    assert ring.read(2) == pytest.approx([1, 2])
    ring.write(np.array([4, 5, 6, 7], dtype=np.float32))  # wraps around the end
    assert ring.read(5) == pytest.approx([3, 4, 5, 6, 7])
    ring.write(np.arange(8, 15, dtype=np.float32))  # more than fits at once
    assert ring.overwritten == 2
    assert ring.read(5) == pytest.approx([10, 11, 12, 13, 14])
    with pytest.raises(ValueError, match="positive"):
        RingBuffer(0)


@given(
    capacity=st.integers(1, 20),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=40),
)
def test_ring_buffer_matches_a_list(capacity: int, ops: list[tuple[bool, int]]) -> None:
    ring = RingBuffer(capacity)
    model: list[float] = []
    lost = 0
    counter = 0.0
    for is_write, n in ops:
        if is_write:
            new = np.arange(counter, counter + n, dtype=np.float32)
            counter += n
            ring.write(new)
            model.extend(new.tolist())
            lost += max(0, len(model) - capacity)
            model = model[-capacity:]
        else:
            # The samples are their own stream positions: the oldest waiting is where it is.
            assert ring.position == (model[0] if model else counter)
            got = ring.read(n)
            if n > len(model):
                assert got is None
            else:
                assert got is not None
                assert got.tolist() == model[:n]
                model = model[n:]
        assert ring.available == len(model)
        assert ring.overwritten == lost


def write_wav(path: Path, left: npt.NDArray[np.float32], rate: int) -> Path:
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(s16(stereo.ravel()))
    return path


def read_all(source: AudioSource) -> list[AudioChunk]:
    chunks: list[AudioChunk] = []
    while (chunk := source.read()) is not None:
        chunks.append(chunk)
    return chunks


def test_wav_stereo_44k_is_mixed_resampled_and_chunked(tmp_path: Path) -> None:
    path = write_wav(tmp_path / "tone.wav", sine(440, 1.0, 44100), 44100)
    source = open_audio_source(WavSourceSpec(path=path), RATE, HOP)
    chunks = read_all(source)
    source.close()
    source.close()

    # 1 s at 16 kHz is 16000 samples: 31 full hops and one padded with zeros.
    assert len(chunks) == 32
    assert [c.index for c in chunks] == list(range(32))
    assert [c.ts for c in chunks] == pytest.approx([i * HOP / RATE for i in range(32)])
    assert all(c.samples.shape == (HOP,) and c.samples.dtype == np.float32 for c in chunks)
    assert np.all(chunks[-1].samples[16000 - 31 * HOP :] == 0)
    audio = np.concatenate([c.samples for c in chunks])[:16000]
    assert peak_hz(audio, RATE) == pytest.approx(440, abs=2)
    # Mixed with a silent right channel: half the left's amplitude.
    assert np.abs(audio[1000:15000]).max() == pytest.approx(0.25, abs=0.01)


def test_truncated_wav_gives_what_it_has_then_one_source_error(tmp_path: Path) -> None:
    data = write_wav(tmp_path / "tone.wav", sine(440, 1.0, RATE), RATE).read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: 44 + len(data[44:]) // 4])  # a quarter of the frames
    source = open_audio_source(WavSourceSpec(path=cut), RATE, HOP)
    chunks = [source.read() for _ in range(-(-4000 // HOP))]  # all that is there
    assert all(c is not None for c in chunks)
    with pytest.raises(SourceError, match=r"0\.75 s short.*truncated") as caught:
        source.read()
    assert caught.value.code == "source.failed"
    assert source.read() is None  # said once; then the end
    source.close()


def test_wav_broken_header_or_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFX\x00\x00\x00\x00WAVEfmt ")
    with pytest.raises(SourceError, match="no RIFF header") as caught:
        open_audio_source(WavSourceSpec(path=broken), RATE, HOP)
    assert "sox" in caught.value.fix
    with pytest.raises(SourceError, match="does not exist"):
        open_audio_source(WavSourceSpec(path=tmp_path / "none.wav"), RATE, HOP)


def test_a_wav_source_on_a_device_is_refused_as_invalid_input(tmp_path: Path) -> None:
    # /dev/null ends at once; /dev/zero, never (unit/test_wav.py): neither is read.
    with pytest.raises(EdgeAgentError, match="character device, not a regular file") as caught:
        open_audio_source(WavSourceSpec(path=Path("/dev/null")), RATE, HOP)
    assert caught.value.code == "input.invalid"


def test_a_low_rate_wav_under_the_file_cap_is_refused_before_it_is_decoded(
    tmp_path: Path,
) -> None:
    # 17 MiB of 1 kHz 8-bit mono is 285 million samples at 16 kHz: decoded and resampled,
    # 1.1 GiB and half a minute of CPU; at the 512 MiB file cap, 40 GiB and the OOM killer,
    # in the agent's start or restore of the spec.
    size = 17 << 20
    fmt = struct.pack("<HHIIHH", 1, 1, 1000, 1000, 1, 8)
    header = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size)
    low = tmp_path / "low.wav"
    with low.open("wb") as f:
        f.write(b"RIFF" + struct.pack("<I", len(header) + size) + header)
        f.truncate(f.tell() + size)  # sparse: the data chunk is all there, as silence
    tracemalloc.start()
    try:
        with pytest.raises(EdgeAgentError, match=r"samples at 16000 Hz, over the") as caught:
            open_audio_source(WavSourceSpec(path=low), RATE, HOP)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.code == "input.invalid"
    assert str(low) in caught.value.problem
    assert "sox" in caught.value.fix
    assert peak < size + (4 << 20), f"{peak >> 20} MiB held to refuse it"


@pytest.fixture
def tone_raw(tmp_path: Path) -> Path:
    raw = tmp_path / "tone.raw"
    raw.write_bytes(s16(sine(1000, 0.5, RATE)))  # 8000 samples: 15 full hops
    return raw


def test_mic_reads_arecord_then_reports_its_exit(
    tmp_path: Path, tone_raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = fake_arecord(
        tmp_path / "bin",
        tone_raw,
        'echo "arecord: main:850: audio open error: Device busy" >&2\nexit 1',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    source = open_audio_source(MicSourceSpec(device="hw:1,0"), RATE, HOP)
    try:
        chunks: list[AudioChunk] = []
        for _ in range(15):
            chunk = source.read()
            assert chunk is not None
            chunks.append(chunk)
        with pytest.raises(SourceError, match=r"code 1.*audio open error: Device busy") as caught:
            source.read()
        assert "arecord -l" in caught.value.fix
    finally:
        source.close()

    args = (bin_dir / "args").read_text().split()
    assert args[args.index("-D") + 1] == "hw:1,0"
    assert args[args.index("-r") + 1] == str(RATE)
    assert args[args.index("-f") + 1] == "S16_LE"
    assert [c.index for c in chunks] == list(range(15))
    audio = np.concatenate([c.samples for c in chunks])
    np.testing.assert_allclose(audio, sine(1000, 0.5, RATE)[: 15 * HOP], atol=1 / 32767)
    assert chunks[3].ts == pytest.approx(3 * HOP / RATE)


def test_mic_stall_raises_and_close_stops_arecord(
    tmp_path: Path, tone_raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = fake_arecord(tmp_path / "bin", tone_raw, "exec sleep 60")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    source = open_audio_source(MicSourceSpec(stall_timeout_s=0.5), RATE, HOP)
    assert isinstance(source, MicSource)
    try:
        for _ in range(15):
            assert source.read() is not None
        start = time.monotonic()
        with pytest.raises(SourceError, match="no audio from ALSA device 'default'"):
            source.read()
        assert 0.4 < time.monotonic() - start < 2
        assert source.dropped == 0
    finally:
        start = time.monotonic()
        source.close()
        assert time.monotonic() - start < 3
    assert source.read() is None


def test_missing_arecord_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceError, match="arecord is not installed") as caught:
        open_audio_source(MicSourceSpec(), RATE, HOP)
    assert "apt-get install alsa-utils" in caught.value.fix


def test_bad_rate_or_hop_is_a_bug_not_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        open_audio_source(WavSourceSpec(path=tmp_path / "x.wav"), 0, HOP)


@pytest.mark.parametrize(
    "device",
    [
        "default",
        "sysdefault",
        "pulse",
        "hw:1",
        "hw:1,0",
        "plughw:1,0",
        "hw:CARD=PCH,DEV=0",
        "plughw:CARD=Device,DEV=0",
        "sysdefault:CARD=PCH",
        "dsnoop:CARD=PCH,DEV=0",
        "front:CARD=PCH,DEV=0",
    ],
)
def test_plain_alsa_device_names_are_taken(device: str) -> None:
    assert MicSourceSpec(device=device).device == device


@pytest.mark.parametrize(
    "device",
    [
        "file:'|touch /tmp/x'",  # ALSA's file PCM pipes the audio into a shell command
        'file:"|id"',
        "file:out",  # a file PCM all the same: it writes `out`
        "tee:default,out",
        "{type file file /tmp/x}",
        "plughw:1,0|id",
        "hw:1,0 ",
        "hw:1;id",
        "default\n",
        "-D/dev/null",  # an option, not a name
        "--help",
        "/dev/snd/pcmC0D0c",
        "hw:",
        "",
    ],
)
def test_a_mic_device_that_is_not_a_plain_alsa_name_is_refused(device: str) -> None:
    with pytest.raises(ValidationError, match="not a plain ALSA device name") as caught:
        MicSourceSpec(device=device)
    assert caught.value.errors()[0]["loc"] == ("device",)


def test_a_mic_spec_whose_device_runs_a_shell_command_is_refused_naming_the_field(
    tmp_path: Path, tone_raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a start_pipeline over MQTT sent: arecord -D "file:'|cmd'" ran cmd on the box, and
    # again at every restore. A fake arecord that runs a pipe device as ALSA would shows
    # nothing is started at all.
    # As ALSA's file PCM does with a device `file:'|CMD'`: CMD goes to a shell.
    pipe_device = """case "$3" in "file:'|"*) cmd=${3#"file:'|"}; sh -c "${cmd%"'"}";; esac\n"""
    bin_dir = fake_arecord(tmp_path / "bin", tone_raw, before=pipe_device, monkeypatch=monkeypatch)
    proof = tmp_path / "X"
    device = f"file:'|touch {proof}'"
    spec = {
        "id": "ears",
        "model": {"name": "vad-silero"},
        "source": {"type": "mic", "device": device},
    }
    with pytest.raises(EdgeAgentError) as caught:
        parse_spec(spec)
    assert (caught.value.code, caught.value.field) == ("command.invalid", "args.spec.source.device")
    assert "spec.source.device" in str(caught.value)
    with pytest.raises(ValueError, match="not a plain ALSA device name"):
        MicSource(device, RATE, HOP, 1.0)
    assert not (bin_dir / "args").exists()
    assert not proof.exists()


def test_a_mic_says_it_is_live_once_as_its_first_chunk_is_read(
    tmp_path: Path, tone_raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = fake_arecord(tmp_path / "bin", tone_raw, "exec sleep 60")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    calls: list[int] = []
    source = open_audio_source(MicSourceSpec(), RATE, HOP, on_live=lambda: calls.append(1))
    try:
        time.sleep(0.2)  # arecord has sent its audio: read, not sent, is what counts
        assert calls == []
        assert source.read() is not None
        assert calls == [1]
        for _ in range(14):
            assert source.read() is not None
        assert calls == [1]
    finally:
        source.close()


def test_a_mic_stamps_its_chunks_where_they_are_after_an_overrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12.5 s of audio sent before the first read, into a 10 s buffer: the oldest 2.5 s are
    # lost. The chunks were stamped by counting them, 2.5 s early from then on, and events
    # said speech came before it did.
    samples = sine(1000, 12.5, RATE)
    raw = tmp_path / "long.raw"
    raw.write_bytes(s16(samples))
    bin_dir = fake_arecord(tmp_path / "bin", raw, "exec sleep 60")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    source = open_audio_source(MicSourceSpec(), RATE, HOP)
    try:
        lost = len(samples) - int(RATE * audio_sources._MIC_BUFFER_S)
        deadline = time.monotonic() + 10
        while source.dropped < lost // HOP and time.monotonic() < deadline:
            time.sleep(0.02)
        first, second = source.read(), source.read()
    finally:
        source.close()
    assert first is not None
    assert second is not None
    assert (first.index, second.index) == (0, 1)
    assert first.ts == pytest.approx(lost / RATE)
    assert second.ts == pytest.approx((lost + HOP) / RATE)
    start = lost % len(samples)
    np.testing.assert_allclose(first.samples, samples[start : start + HOP], atol=1 / 32767)


# What arecord 1.2 prints without -q on a raw device fixed at 48 kHz (alsa-utils aplay.c).
BANNER = "Recording raw data 'stdin' : Signed 16 bit Little Endian, Rate 16000 Hz, Mono"
RATE_WARNING = (
    "Warning: rate is not accurate (requested = 16000Hz, got = 48000Hz)\n"
    "         please, try the plug plugin "
)


def test_a_mic_that_records_at_another_rate_is_refused_naming_plughw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # With -q arecord kept quiet and recorded at 48 kHz, and the VAD took it for 16 kHz:
    # speech three times slower, every timestamp three times too fast, nothing said.
    raw = tmp_path / "at48k.raw"
    raw.write_bytes(s16(sine(1000, 0.5, 48000)))
    # Quiet mode says nothing, as arecord's does.
    warn = (
        'case " $* " in *" -q "*) ;; *) '
        f"""printf '%s\\n%s\\n' "{BANNER}" "{RATE_WARNING}" >&2;; esac\n"""
    )
    bin_dir = fake_arecord(tmp_path / "bin", raw, "exec sleep 60", warn, monkeypatch)
    source = open_audio_source(MicSourceSpec(device="hw:1,0", stall_timeout_s=2), RATE, HOP)
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(SourceError) as caught:
            source.read()
    finally:
        source.close()
    assert "records at 48000 Hz, not the 16000 Hz" in caught.value.problem
    assert "plughw:1,0" in caught.value.fix
    assert caught.value.code == "source.unreachable"
    assert "-q" not in (bin_dir / "args").read_text().split()
    assert not [r for r in caplog.records if "Recording" in r.getMessage()]  # no chatter


def test_arecord_chatter_on_stderr_never_blocks_the_audio(
    tmp_path: Path, tone_raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pipe nobody drained would hold arecord at its 64 KiB: the audio would stall.
    chatter = tmp_path / "chatter.txt"
    chatter.write_text("overrun!!! (at least 1.234 ms long)\n" * 10_000)  # 350 KB
    bin_dir = fake_arecord(
        tmp_path / "bin",
        tone_raw,
        f"cat {chatter} >&2\ncat {tone_raw}\n"
        'echo "arecord: pcm_read:2221: read error: No such device" >&2\nexit 1',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    source = open_audio_source(MicSourceSpec(stall_timeout_s=2), RATE, HOP)
    try:
        for _ in range(31):  # the tone twice, around the chatter: 31 whole hops
            assert source.read() is not None
        with pytest.raises(SourceError, match=r"code 1.*read error: No such device") as caught:
            source.read()
    finally:
        source.close()
    assert "plughw" in caught.value.fix


def test_a_mic_whose_reader_dies_fails_at_once_not_after_its_stall_timeout(
    tmp_path: Path, tone_raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bug in the reader thread left the source unmarked: `read` waited out the whole
    # stall timeout, then said "no audio", and the crash went only to stderr.
    fake_arecord(tmp_path / "bin", tone_raw, "exec sleep 60", monkeypatch=monkeypatch)

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(MicSource, "_pump_pipes", broken)
    source = MicSource("default", RATE, HOP, 30.0)
    started = time.monotonic()
    try:
        with pytest.raises(SourceError):
            source.read()
    finally:
        source.close()
    assert time.monotonic() - started < 10.0
