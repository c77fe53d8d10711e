"""A small RIFF/WAVE reader.

The stdlib `wave` module reads only integer PCM, and sound from TTS tools and
DAWs is often float. This reader takes integer PCM (8-bit unsigned, 16, 24,
32-bit signed), IEEE float (32, 64-bit) and their WAVE_FORMAT_EXTENSIBLE forms,
and fails with a `WavError` saying what is wrong with anything else.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_agent.errors import EdgeAgentError
from edge_agent.input_files import FileTooLargeError, NotRegularFileError, read_bounded

FloatArray = npt.NDArray[np.float32]

_PCM = 1
_FLOAT = 3
_EXTENSIBLE = 0xFFFE
_TAG_NAMES = {
    2: "ADPCM",
    6: "A-law",
    7: "mu-law",
    0x11: "IMA ADPCM",
    0x31: "GSM 6.10",
    0x50: "MPEG",
    0x55: "MP3",
}
_CONVERT = "convert it with `sox in.wav -e signed -b 16 out.wav`"
# Writers streaming to a pipe cannot seek back to fill in the data size, so they leave
# a placeholder near 2 or 4 GiB (espeak-ng writes 0x7FFFF000): such a size means "to
# the end of the file". A smaller size past the end means the file was cut short.
_STREAMING_SIZE = 0x7FF00000
# Rates and channel counts any real recorder or DAW writes. A header outside them is
# damaged, and trusting it would make the resampler allocate hundreds of GiB (an
# absurd rate) or spin for minutes (a rate of a few Hz), so it is refused up front.
MIN_RATE = 1_000
MAX_RATE = 384_000
MAX_CHANNELS = 32
MAX_WAV_FILE_BYTES = 512 << 20
"""The largest WAV file read. Speech is far below it: 512 MiB is 4.6 hours of 16 kHz 16-bit
mono (what speech models take) and 46 minutes of 48 kHz 16-bit stereo."""
MAX_DECODED_SAMPLES = 1 << 28
"""The most float32 samples a WAV may decode to (frames times channels), and the most it
may be resampled to: 1 GiB each, 4.6 hours at 16 kHz. The file cap alone did not bound
memory, which grows with the samples, not the bytes: a 1 kHz 8-bit file under it became
40 GiB at 16 kHz, and a WAV source on it was killed by the OOM killer at every restore.
Under both bounds, decoding and resampling hold at most about 3 GiB at their peak (the
file's bytes, then the decoded samples, the input padded for the filter and the output)."""
_SPLIT = "cut it into parts, e.g. `sox in.wav part.wav trim 0 3600 : newfile : restart`"


class WavError(ValueError):
    """The bytes are not a WAV file this reader can decode."""


class WavTooLongError(Exception):
    """The WAV would decode or resample to more than `MAX_DECODED_SAMPLES`."""


def _unsupported(what: str) -> WavError:
    return WavError(f"unsupported WAV encoding: {what}; {_CONVERT}")


@dataclass(frozen=True, slots=True)
class WavAudio:
    """A decoded WAV file."""

    samples: FloatArray
    """float32 of shape (frames, channels), in [-1, 1]."""
    rate: int
    """Sample rate, Hz."""
    missing_s: float
    """Seconds of audio the header promises beyond the end of the file: > 0 means truncated."""


def _chunk_id(four: bytes) -> bool:
    """Whether `four` bytes can be a RIFF chunk id: printable ASCII, as every id is."""
    return len(four) == 4 and all(0x20 <= b < 0x7F for b in four)


def _chunks(data: bytes) -> tuple[bytes | None, memoryview | None, int, bool]:
    """Find the fmt chunk body, the data chunk body, how many data bytes are missing, and
    whether the data size was a streaming placeholder (the data runs to the end)."""
    fmt: bytes | None = None
    audio: memoryview | None = None
    missing = 0
    streamed = False
    view = memoryview(data)
    pos = 12
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack_from("<I", data, pos + 4)
        body = pos + 8
        remaining = len(data) - body
        if chunk_id == b"data":
            if remaining < size < _STREAMING_SIZE:
                missing = size - remaining
            # A size of 0 with bytes after it that are no chunk header: a recorder's
            # placeholder, never rewritten (killed, or it could not seek back). Taken at its
            # word, the whole recording was refused as empty; FFmpeg reads it to the end too.
            unwritten = size == 0 and remaining >= 4 and not _chunk_id(data[body : body + 4])
            streamed = size >= _STREAMING_SIZE or unwritten
            size = remaining if unwritten else min(size, remaining)
            audio = view[body : body + size]
        elif chunk_id == b"fmt ":
            fmt = data[body : body + min(size, remaining)]
        if size > remaining:
            break
        # Chunks are word-aligned: odd sizes are followed by a pad byte.
        pos = body + size + (size & 1)
    return fmt, audio, missing, streamed


def parse_wav(data: bytes) -> tuple[FloatArray, int]:
    """Decode the bytes of a WAV file, as much audio as there is.

    Args:
        data: the whole file.

    Returns:
        Samples as float32 of shape (frames, channels) in [-1, 1], and the sample rate in Hz.

    Raises:
        WavError: the bytes are not a WAV file, or use an encoding this reader does not take.
        WavTooLongError: it holds more than `MAX_DECODED_SAMPLES` samples.
    """
    wav = decode_wav(data)
    return wav.samples, wav.rate


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A WAV file's header, checked, and its whole frames of audio bytes, not decoded."""

    tag: int
    channels: int
    rate: int
    width: int
    audio: memoryview
    """The data chunk's whole frames."""
    missing: int
    """Bytes the header promises beyond the end of the file."""

    @property
    def frames(self) -> int:
        return len(self.audio) // (self.width * self.channels)


def _parse(data: bytes) -> _Parsed:
    """Check a WAV file's header against its bytes; `decode_wav` says what is refused."""
    if len(data) < 12 or data[:4] != b"RIFF":
        raise WavError("not a WAV file: no RIFF header")
    if data[8:12] != b"WAVE":
        raise WavError(f"not a WAV file: RIFF form is {bytes(data[8:12])!r}, not b'WAVE'")
    fmt, audio, missing, streamed = _chunks(data)
    if fmt is None:
        raise WavError("WAV has no fmt chunk")
    if len(fmt) < 16:
        raise WavError(f"WAV fmt chunk is too short: {len(fmt)} bytes, expected at least 16")
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == _EXTENSIBLE:
        if len(fmt) < 26:
            raise WavError(
                f"WAV fmt chunk is too short for WAVE_FORMAT_EXTENSIBLE: {len(fmt)} bytes"
            )
        # The subformat GUID starts with the plain format tag it stands for.
        (tag,) = struct.unpack_from("<H", fmt, 24)
    if not 1 <= channels <= MAX_CHANNELS:
        raise WavError(
            f"WAV fmt chunk says {channels} channels, outside 1 to {MAX_CHANNELS}: "
            "the header is damaged"
        )
    if not MIN_RATE <= rate <= MAX_RATE:
        raise WavError(
            f"WAV fmt chunk says a sample rate of {rate} Hz, outside {MIN_RATE} to "
            f"{MAX_RATE} Hz: the header is damaged"
        )
    if tag == _PCM and bits not in (8, 16, 24, 32):
        raise _unsupported(f"{bits}-bit PCM")
    if tag == _FLOAT and bits not in (32, 64):
        raise _unsupported(f"{bits}-bit float")
    if tag not in (_PCM, _FLOAT):
        name = _TAG_NAMES.get(tag, "unknown")
        raise _unsupported(f"format tag {tag} ({name})")
    if audio is None:
        raise WavError("WAV has no audio data")

    width = bits // 8
    frame = width * channels
    usable = len(audio) - len(audio) % frame
    if usable == 0:
        held = f"{len(audio)} of the {frame} bytes of one frame" if audio else "no bytes"
        cut = " (the file is truncated)" if missing else ""
        raise WavError(f"WAV has no audio samples: its data chunk holds {held}{cut}")
    if usable < len(audio) and not missing and not streamed:
        # A complete chunk that ends mid-frame was written with another channel count
        # or sample width than the header says; decoding it would scramble the channels.
        raise WavError(
            f"WAV data chunk holds {len(audio)} bytes, not a whole number of {frame}-byte "
            f"frames ({channels} channels of {bits} bits): the header is damaged"
        )
    return _Parsed(tag, channels, int(rate), width, audio[:usable], missing)


def decode_wav(
    data: bytes, to_rate: int | None = None, max_samples: int = MAX_DECODED_SAMPLES
) -> WavAudio:
    """Decode the bytes of a WAV file, saying whether it was cut short.

    Args:
        data: the whole file.
        to_rate: the rate the caller resamples it to, Hz; None: it is not resampled.
        max_samples: the most samples it may decode to, and be resampled to.

    Raises:
        WavError: as `parse_wav`.
        WavTooLongError: its header says it holds more than `max_samples` samples, or
            would at `to_rate`; said before anything is decoded.
    """
    wav = _parse(data)
    _check_length(wav.frames, wav.channels, wav.rate, to_rate, max_samples)
    samples = _decode(np.frombuffer(wav.audio, dtype=np.uint8), wav.tag, wav.width)
    if wav.tag == _FLOAT:
        # Float WAV may stray past full scale or carry NaNs; models expect [-1, 1].
        samples = np.clip(np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    frame = wav.width * wav.channels
    return WavAudio(samples.reshape(-1, wav.channels), wav.rate, wav.missing / (frame * wav.rate))


def _check_length(
    frames: int, channels: int, rate: int, to_rate: int | None, max_samples: int
) -> None:
    decoded = frames * channels
    resampled = frames if to_rate is None else -(-frames * to_rate // rate)
    if max(decoded, resampled) <= max_samples:
        return
    hours = frames / rate / 3600
    if decoded > max_samples:
        what = f"{decoded} samples ({channels} channels)"
    else:
        what = f"{resampled} samples at {to_rate} Hz"
    raise WavTooLongError(
        f"its {hours:.1f} hours at {rate} Hz decode to {what}, over the {max_samples} "
        f"held at most ({max_samples * 4 >> 20} MiB of float32)"
    )


def _decode(raw: npt.NDArray[np.uint8], tag: int, width: int) -> FloatArray:
    if tag == _FLOAT:
        return raw.view("<f4" if width == 4 else "<f8").astype(np.float32)
    if width == 1:
        # 8-bit PCM alone among the widths is unsigned, centred on 128.
        return ((raw.astype(np.float32) - 128.0) / 128.0).astype(np.float32)
    if width == 3:
        # Each sample's bytes in the top three of an int32, whose arithmetic shift then
        # extends the sign: int32 per byte and float64 temporaries held 5 times the audio.
        words = np.zeros((len(raw) // 3, 4), dtype=np.uint8)
        words[:, 1:] = raw.reshape(-1, 3)
        ints = words.view("<i4").ravel()
        ints >>= 8
    else:
        ints = raw.view("<i2" if width == 2 else "<i4")
    # In float32 throughout: a float64 quotient held twice the decoded audio at the peak.
    # Scaling by a power of two is exact, so the samples are those the quotient gave.
    scaled = ints.astype(np.float32)
    scaled *= np.float32(1.0 / (1 << (8 * width - 1)))
    return scaled


def _refused(path: Path, exc: Exception) -> EdgeAgentError:
    return EdgeAgentError(f"WAV file {path} is refused: {exc}", _SPLIT, code="input.invalid")


def _wav_bytes(path: Path) -> bytes:
    try:
        return read_bounded(path, MAX_WAV_FILE_BYTES)
    except NotRegularFileError as exc:
        raise EdgeAgentError(
            f"WAV file {path} is refused: {exc}",
            "give a WAV file (a device or a FIFO is read without end)",
            code="input.invalid",
        ) from None
    except FileTooLargeError as exc:
        raise _refused(path, exc) from None


def read_wav(path: Path, to_rate: int | None = None) -> tuple[FloatArray, int]:
    """Read a WAV file; see `parse_wav` for what it returns.

    Args:
        path: the file.
        to_rate: the rate the caller resamples it to, Hz; None: it is not resampled.

    Raises:
        EdgeAgentError: input.invalid for a device, a FIFO or a folder, or a file over
            `MAX_WAV_FILE_BYTES`, before it is read; for one that would decode, or
            resample to `to_rate`, to more than `MAX_DECODED_SAMPLES`, before it is decoded.
        OSError: the file cannot be opened or read.
        WavError: as `parse_wav`.
    """
    wav = load_wav(path, to_rate)
    return wav.samples, wav.rate


def load_wav(path: Path, to_rate: int | None = None) -> WavAudio:
    """Read a WAV file; see `decode_wav` for what it returns, and `read_wav` for what it
    raises."""
    try:
        return decode_wav(_wav_bytes(path), to_rate)
    except WavTooLongError as exc:
        raise _refused(path, exc) from None


def wav_length(path: Path, to_rate: int | None = None) -> tuple[int, int]:
    """How long a WAV file is: its frames and rate, with every check and refusal of
    `read_wav`, and no sample decoded (for a caller that reads part of long recordings:
    10 minutes of 16 kHz 16-bit mono took 1.6 ms against 10.0 ms to decode, and twice
    the file's size in float32 is never held)."""
    try:
        wav = _parse(_wav_bytes(path))
        _check_length(wav.frames, wav.channels, wav.rate, to_rate, MAX_DECODED_SAMPLES)
    except WavTooLongError as exc:
        raise _refused(path, exc) from None
    return wav.frames, wav.rate


def to_mono(samples: FloatArray) -> FloatArray:
    """Average the channels of (frames, channels) audio; 1-D audio comes back as it is."""
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim == 1:
        return audio
    if audio.ndim != 2:
        raise ValueError(f"audio should be (frames, channels); got shape {audio.shape}")
    if audio.shape[1] == 1:
        # A view: the mean's copy held the whole clip twice.
        return audio[:, 0]
    mono: FloatArray = audio.mean(axis=1, dtype=np.float32)
    return mono
