"""WAV parsing: files from stdlib `wave`, hand-built float and odd files, and espeak-ng."""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import sys
import threading
import tracemalloc
import wave
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.audio.resample import MAX_RATIO, resample
from edge_agent.audio.wav import (
    MAX_RATE,
    MAX_WAV_FILE_BYTES,
    MIN_RATE,
    WavError,
    WavTooLongError,
    decode_wav,
    load_wav,
    parse_wav,
    read_wav,
    to_mono,
)
from edge_agent.errors import EdgeAgentError


def write_pcm(path: Path, frames: bytes, width: int, channels: int = 1, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(frames)
    return path


def fmt_chunk(tag: int, channels: int, rate: int, bits: int, extra: bytes = b"") -> bytes:
    # Masked as a writer's fixed-width fields would be, so damaged headers can be built.
    align = (channels * bits // 8) & 0xFFFF
    byte_rate = (rate * align) & 0xFFFFFFFF
    body = struct.pack("<HHIIHH", tag, channels, rate, byte_rate, align, bits) + extra
    return b"fmt " + struct.pack("<I", len(body)) + body


def chunk(chunk_id: bytes, body: bytes, size: int | None = None) -> bytes:
    pad = b"\0" if len(body) % 2 else b""
    return chunk_id + struct.pack("<I", len(body) if size is None else size) + body + pad


def riff(*chunks: bytes) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_16_bit_pcm(tmp_path: Path) -> None:
    ints = np.array([0, 16384, -32768, 32767], dtype="<i2")
    samples, rate = read_wav(write_pcm(tmp_path / "a.wav", ints.tobytes(), 2, rate=22050))
    assert rate == 22050
    assert samples.dtype == np.float32
    np.testing.assert_allclose(samples[:, 0], [0.0, 0.5, -1.0, 32767 / 32768])


def test_8_bit_pcm_is_unsigned(tmp_path: Path) -> None:
    samples, _ = read_wav(write_pcm(tmp_path / "a.wav", bytes([0, 128, 255, 64]), 1))
    np.testing.assert_allclose(samples[:, 0], [-1.0, 0.0, 127 / 128, -0.5])


def test_24_and_32_bit_pcm(tmp_path: Path) -> None:
    values = [-(1 << 23), 1 << 22, -1, (1 << 23) - 1]
    raw24 = b"".join(v.to_bytes(3, "little", signed=True) for v in values)
    samples, _ = read_wav(write_pcm(tmp_path / "a.wav", raw24, 3))
    np.testing.assert_allclose(samples[:, 0], np.array(values) / (1 << 23), rtol=1e-6)
    raw32 = np.array([-(1 << 31), 1 << 30], dtype="<i4").tobytes()
    samples, _ = read_wav(write_pcm(tmp_path / "b.wav", raw32, 4))
    np.testing.assert_allclose(samples[:, 0], [-1.0, 0.5])


def test_stereo_keeps_channels_apart(tmp_path: Path) -> None:
    left = np.full(100, 8192, dtype="<i2")
    right = np.full(100, -16384, dtype="<i2")
    interleaved = np.stack([left, right], axis=1).tobytes()
    samples, _ = read_wav(write_pcm(tmp_path / "a.wav", interleaved, 2, channels=2))
    assert samples.shape == (100, 2)
    np.testing.assert_allclose(samples[0], [0.25, -0.5])
    np.testing.assert_allclose(to_mono(samples), np.full(100, -0.125))


def test_float32_after_an_odd_sized_chunk() -> None:
    values = np.array([0.0, 0.25, -0.75, 1.5, np.nan], dtype="<f4")
    data = riff(
        fmt_chunk(3, 1, 48000, 32),
        chunk(b"LIST", b"odd"),  # 3 bytes and a pad byte
        chunk(b"data", values.tobytes()),
    )
    samples, rate = parse_wav(data)
    assert rate == 48000
    # Out-of-range and NaN samples are brought back into [-1, 1].
    np.testing.assert_allclose(samples[:, 0], [0.0, 0.25, -0.75, 1.0, 0.0])


def test_float64_and_extensible() -> None:
    values = np.array([0.5, -0.5], dtype="<f8")
    samples, _ = parse_wav(riff(fmt_chunk(3, 1, 8000, 64), chunk(b"data", values.tobytes())))
    np.testing.assert_allclose(samples[:, 0], [0.5, -0.5])
    guid_tail = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    extra = struct.pack("<HHI", 22, 32, 0x3) + struct.pack("<H", 3) + guid_tail
    f32 = np.array([[0.1, -0.2], [0.3, -0.4]], dtype="<f4")
    samples, _ = parse_wav(
        riff(fmt_chunk(0xFFFE, 2, 8000, 32, extra), chunk(b"data", f32.tobytes()))
    )
    np.testing.assert_allclose(samples, f32)


# 0: a recorder's placeholder, never rewritten (killed, or it could not seek back): the
# whole recording was refused as empty.
@pytest.mark.parametrize("size", [0, 0x7FFFFFFF, 0xFFFFFFFF])
def test_streamed_data_size_means_to_end_of_file(size: int) -> None:
    ints = np.arange(-50, 50, dtype="<i2")
    # A stray byte at the end is not a whole frame and must be ignored.
    data = riff(fmt_chunk(1, 1, 16000, 16)) + b"data" + struct.pack("<I", size)
    samples, _ = parse_wav(data + ints.tobytes() + b"\x01")
    np.testing.assert_allclose(samples[:, 0], ints / 32768)


def test_fmt_after_data_is_found() -> None:
    ints = np.array([1000, -1000], dtype="<i2")
    samples, _ = parse_wav(riff(chunk(b"data", ints.tobytes()), fmt_chunk(1, 1, 16000, 16)))
    np.testing.assert_allclose(samples[:, 0], ints / 32768)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no RIFF header"),
        (b"ID3\x03 some mp3", "no RIFF header"),
        (b"RIFF\x04\x00\x00\x00AVI LIST", "not b'WAVE'"),
        (riff(chunk(b"data", b"\0\0")), "no fmt chunk"),
        (riff(chunk(b"fmt ", b"\x01\x00\x01\x00")), "fmt chunk is too short"),
        (riff(fmt_chunk(2, 1, 8000, 4), chunk(b"data", b"\0\0")), r"format tag 2 \(ADPCM\).*sox"),
        (riff(fmt_chunk(0x55, 1, 8000, 0)), r"format tag 85 \(MP3\)"),
        (riff(fmt_chunk(1, 1, 8000, 12), chunk(b"data", b"\0\0")), "12-bit PCM"),
        (riff(fmt_chunk(3, 1, 8000, 16), chunk(b"data", b"\0\0")), "16-bit float"),
        (riff(fmt_chunk(1, 0, 8000, 16), chunk(b"data", b"\0\0")), "0 channels"),
        (riff(fmt_chunk(1, 1, 0, 16), chunk(b"data", b"\0\0")), "0 Hz"),
        (riff(fmt_chunk(1, 1, 8000, 16)), "no audio data"),
        # Damaged headers that would have the resampler allocate or spin without end.
        (riff(fmt_chunk(1, 1, 0xFFFFFFFF, 16), chunk(b"data", b"\0\0")), "4294967295 Hz"),
        (riff(fmt_chunk(1, 1, 1, 16), chunk(b"data", b"\0\0")), "1 Hz, outside 1000 to"),
        (riff(fmt_chunk(1, 1, 999, 16), chunk(b"data", b"\0\0")), "999 Hz"),
        (riff(fmt_chunk(1, 1, 384001, 16), chunk(b"data", b"\0\0")), "to 384000 Hz"),
        (riff(fmt_chunk(1, 33, 8000, 16), chunk(b"data", bytes(66))), "33 channels"),
        (riff(fmt_chunk(1, 0xFFFF, 8000, 16), chunk(b"data", b"\0\0")), "outside 1 to 32"),
        # Nothing to hear: no bytes, or less than one frame of them.
        (riff(fmt_chunk(1, 1, 8000, 16), chunk(b"data", b"")), "no audio samples.*no bytes"),
        # A data chunk truly empty, with a chunk after it: not a placeholder.
        (
            riff(fmt_chunk(1, 1, 8000, 16), chunk(b"data", b""), chunk(b"LIST", b"INFOISFT")),
            "no audio samples.*no bytes",
        ),
        (riff(fmt_chunk(1, 1, 8000, 16), chunk(b"data", b"\x01")), "1 of the 2 bytes"),
        (riff(fmt_chunk(1, 2, 8000, 24), chunk(b"data", bytes(5))), "5 of the 6 bytes"),
        # A whole chunk ending mid-frame: the header's channels or width are wrong.
        (riff(fmt_chunk(1, 2, 8000, 16), chunk(b"data", bytes(6))), "not a whole number of 4"),
        (riff(fmt_chunk(1, 1, 8000, 16))[:30], "no fmt chunk|too short"),
    ],
)
def test_broken_files_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(WavError, match=message) as caught:
        parse_wav(data)
    assert "\n" not in str(caught.value)


def test_rates_and_channels_at_the_limits_are_read() -> None:
    for rate in (1000, 384000):
        _, got = parse_wav(riff(fmt_chunk(1, 1, rate, 16), chunk(b"data", b"\0\0")))
        assert got == rate
    samples, _ = parse_wav(riff(fmt_chunk(1, 32, 8000, 8), chunk(b"data", bytes(range(64)))))
    assert samples.shape == (2, 32)


def test_a_file_cut_before_its_first_sample_says_it_is_truncated() -> None:
    header = riff(fmt_chunk(1, 1, 16000, 16)) + b"data" + struct.pack("<I", 32000)
    with pytest.raises(WavError, match=r"no audio samples.*\(the file is truncated\)"):
        parse_wav(header)
    with pytest.raises(WavError, match=r"1 of the 2 bytes.*truncated"):
        parse_wav(header + b"\x01")


def test_resample_refuses_a_ratio_no_wav_it_reads_can_ask_for() -> None:
    # Every rate the reader takes is within MAX_RATIO of every model rate; a rate that
    # slipped past would mean an output of MAX_RATIO times the input, or more.
    x = np.zeros(10, np.float32)
    for from_rate, to_rate in [(1, 16000), (16000, 1), (0xFFFFFFFF, 16000)]:
        with pytest.raises(ValueError, match=f"{from_rate} Hz to {to_rate} Hz"):
            resample(x, from_rate, to_rate)
    assert len(resample(x, MAX_RATE, MIN_RATE)) == 0  # 384 times fewer: still taken
    assert MAX_RATE <= MAX_RATIO * MIN_RATE


def test_resampling_from_a_co_prime_rate_is_bounded_and_accurate() -> None:
    # 383999 and 16000 share no factor: an exact polyphase table would hold 16000
    # phases of 836 taps, over 1 GiB with its temporaries, for one second of audio.
    rate = 383_999
    t = np.arange(rate) / rate
    x = (0.5 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32)
    tracemalloc.start()
    try:
        y = resample(x, rate, 16000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"{peak / 2**20:.0f} MiB"
    want = 0.5 * np.sin(2 * np.pi * 3000 * np.arange(16000) / 16000)
    # Away from the ends, where the filter sees the zeros beyond the clip.
    np.testing.assert_allclose(y[800:-800], want[800:-800], atol=1e-3)


def test_wav_error_is_a_value_error() -> None:
    assert issubclass(WavError, ValueError)


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_wav_error(data: bytes) -> None:
    try:
        samples, rate = parse_wav(data)
    except WavError:
        return
    assert samples.ndim == 2
    assert rate > 0


VALID = riff(fmt_chunk(1, 2, 16000, 16), chunk(b"LIST", b"x"), chunk(b"data", bytes(range(40))))


@given(st.integers(0, len(VALID)), st.integers(0, len(VALID) - 1), st.integers(0, 255))
def test_damaged_files_parse_or_raise_wav_error(cut: int, at: int, value: int) -> None:
    damaged = bytearray(VALID)
    damaged[at] = value
    try:
        samples, _ = parse_wav(bytes(damaged[:cut]))
    except WavError:
        return
    assert samples.dtype == np.float32
    assert np.all(np.abs(samples) <= 1.0)


def test_to_mono_passes_1d_through_and_rejects_3d() -> None:
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    np.testing.assert_array_equal(to_mono(x), x)
    with pytest.raises(ValueError, match="frames, channels"):
        to_mono(np.zeros((2, 2, 2), np.float32))


def espeak() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        pytest.fail("espeak-ng is not on PATH; install it (apt-get install espeak-ng) to run this")
    return path


def test_real_espeak_ng_output(tmp_path: Path) -> None:
    exe = espeak()
    written = tmp_path / "hello.wav"
    subprocess.run([exe, "-w", str(written), "hello world"], check=True, timeout=30)
    # Piped output carries the streaming data size that espeak-ng never fixes up.
    streamed = tmp_path / "streamed.wav"
    with streamed.open("wb") as out:
        subprocess.run([exe, "--stdout", "hello world"], stdout=out, check=True, timeout=30)

    samples, rate = read_wav(written)
    with wave.open(str(written), "rb") as w:
        reference = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2") / 32768
        assert rate == w.getframerate()
    assert samples.shape[1] == 1
    assert samples.shape[0] / rate > 0.3
    assert np.abs(samples).max() > 0.05
    np.testing.assert_allclose(samples[:, 0], reference)

    piped, piped_rate = read_wav(streamed)
    assert piped_rate == rate
    np.testing.assert_array_equal(piped, samples)
    # A streaming placeholder size is "to the end", not a file cut short.
    assert decode_wav(streamed.read_bytes()).missing_s == 0.0
    assert decode_wav(written.read_bytes()).missing_s == 0.0


def test_a_file_shorter_than_its_header_says_is_truncated(tmp_path: Path) -> None:
    ints = np.arange(16000, dtype="<i2")  # 1 s at 16 kHz, 16-bit mono
    data = write_pcm(tmp_path / "a.wav", ints.tobytes(), 2).read_bytes()
    cut = decode_wav(data[: 44 + 8000 * 2])
    assert cut.missing_s == pytest.approx(0.5)
    np.testing.assert_allclose(cut.samples[:, 0], ints[:8000] / 32768)
    # Mid-sample: the half sample is dropped and counted as missing.
    assert decode_wav(data[: 44 + 8001]).missing_s == pytest.approx((32000 - 8001) / 32000)
    assert decode_wav(data).missing_s == 0.0


def test_a_wav_on_dev_zero_is_refused_before_a_byte_is_read() -> None:
    # It was read whole: the agent's memory grew until the OOM killer came. Tried in a
    # child held to 1 GiB, so that if it ever reads again it fails here, not the machine.
    child = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))\n"
        "from pathlib import Path\n"
        "from edge_agent.audio.wav import load_wav\n"
        "from edge_agent.errors import EdgeAgentError\n"
        "try:\n"
        "    load_wav(Path('/dev/zero'))\n"
        "except EdgeAgentError as exc:\n"
        "    print(exc.code, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(
        "input.invalid WAV file /dev/zero is refused: it is a character device, not a regular file"
    ), done.stdout


def test_a_wav_that_is_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "speech.wav"
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            read_wav(fifo)
        except BaseException as exc:
            raised.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5.0)
    blocked = reader.is_alive()
    if blocked:
        # Opened for reading, it waited for a writer: be one, so the thread ends.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5.0)
    assert not blocked, "reading the FIFO waited for a writer"
    [error] = raised
    assert isinstance(error, EdgeAgentError), error
    assert error.code == "input.invalid"
    assert "a FIFO, not a regular file" in str(error)


def test_a_wav_over_the_cap_is_refused_without_reading_it(tmp_path: Path) -> None:
    huge = tmp_path / "huge.wav"
    with huge.open("wb") as f:
        f.write(riff(fmt_chunk(1, 1, 16000, 16), chunk(b"data", b"", size=0xFFFFFFFF)))
        f.truncate(MAX_WAV_FILE_BYTES + 1)  # sparse: no disk, but read whole, all of it
    tracemalloc.start()
    try:
        with pytest.raises(EdgeAgentError, match="over the 512 MiB read at most") as caught:
            load_wav(huge)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.code == "input.invalid"
    assert "sox" in caught.value.fix
    assert peak < 1 << 20, f"{peak >> 20} MiB held to refuse it"


def test_the_sample_bound_counts_channels_and_the_rate_resampled_to() -> None:
    data = riff(fmt_chunk(1, 2, 8000, 16), chunk(b"data", bytes(4 * 100)))  # 100 frames
    assert decode_wav(data, 16000, max_samples=200).samples.shape == (100, 2)
    with pytest.raises(WavTooLongError, match=r"200 samples \(2 channels\), over the 199"):
        decode_wav(data, 8000, max_samples=199)
    with pytest.raises(WavTooLongError, match=r"201 samples at 16080 Hz, over the 200"):
        decode_wav(data, 16080, max_samples=200)
    assert decode_wav(data, None, max_samples=200).rate == 8000


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_integer_pcm_decodes_to_the_exact_quotient(width: int) -> None:
    # The decode runs in float32 to halve its peak; the samples are the float64 quotient's.
    rng = np.random.default_rng(width)
    raw = rng.integers(0, 256, 3 * width * 1000, dtype=np.uint8)
    raw[: 2 * width] = [0] * width + [255] * width  # the extremes
    data = riff(fmt_chunk(1, 3, 16000, 8 * width), chunk(b"data", raw.tobytes()))
    got = decode_wav(data).samples.ravel()
    if width == 1:
        want = (raw.astype(np.float64) - 128) / 128
    else:
        words = raw.reshape(-1, width)
        ints = sum(words[:, k].astype(np.int64) << (8 * k) for k in range(width))
        ints = np.where(ints >= 1 << (8 * width - 1), ints - (1 << (8 * width)), ints)
        want = ints / float(1 << (8 * width - 1))
    np.testing.assert_array_equal(got, want.astype(np.float32))
