"""Audio sources: WAV files and ALSA microphones, cut into `hop`-sample chunks.

The microphone is captured with `arecord` (alsa-utils) in a subprocess rather than
a Python audio binding: it is on every Linux box, needs no wheel, and a crash in
the sound stack takes down arecord, not the agent.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator

from edge_agent.audio.resample import resample
from edge_agent.audio.wav import WavError, load_wav, to_mono
from edge_agent.logs import Throttle, log_event
from edge_agent.pipelines.base import AudioChunk, AudioSource, SourceError

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]

_ARECORD_FIX = "install it with `apt-get install alsa-utils` and list devices with `arecord -l`"
# Seconds of audio the mic keeps when the consumer falls behind; older samples go.
_MIC_BUFFER_S = 10.0
_STOP_S = 2.0
# A consumer that keeps falling behind is one line a minute.
_OVERRUN_LOG_EVERY_S = 60.0

# ALSA parses a device name as config: `file:'|cmd'` is a file PCM that pipes the audio
# into a shell command, so a name from a spec (an MQTT command) ran code on the box at
# every start and restore. Only plain names pass: an identifier (`default`, `pulse`, a PCM
# the admin defined in asound.conf), or one of the card PCMs below with card arguments
# (`hw:1,0`, `plughw:CARD=PCH,DEV=0`). No quotes, braces, pipes, slashes or spaces, and
# never a leading '-' an argv could take for an option.
_ALSA_ARG = r"(?:[A-Za-z_][A-Za-z0-9_]*=)?[A-Za-z0-9_]+"
_ALSA_PCM = re.compile(
    rf"(?P<name>[A-Za-z_][A-Za-z0-9_]{{0,63}})(?::{_ALSA_ARG}(?:,{_ALSA_ARG}){{0,3}})?"
)
ALSA_CARD_PCMS = ("hw", "plughw", "default", "sysdefault", "front", "dsnoop")
"""The PCMs whose arguments may be given: each takes only a card, a device and a
subdevice. Others with arguments (`file`, `tee`, `shm`) write files or open sockets."""
ALSA_DEVICE_FORMS = (
    "an ALSA PCM name: default, sysdefault, a PCM defined in asound.conf (letters, digits, "
    "'_'), or hw:N, hw:N,M, plughw:N,M, hw:CARD=name,DEV=N, plughw:CARD=name,DEV=N, "
    "sysdefault:CARD=name, front:CARD=name,DEV=N, dsnoop:CARD=name,DEV=N"
)


def is_alsa_device(name: str) -> bool:
    """Whether `name` is a plain ALSA PCM name arecord may be given (`ALSA_DEVICE_FORMS`)."""
    # fullmatch: `$` would let a trailing newline through.
    found = _ALSA_PCM.fullmatch(name)
    if found is None:
        return False
    return ":" not in name or found["name"] in ALSA_CARD_PCMS


class WavSourceSpec(BaseModel):
    """A WAV file at any rate and channel count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["wav"] = Field("wav", description="Source kind.")
    path: Path = Field(
        description="WAV file: integer PCM or float, any rate and channels; a regular file "
        "of 512 MiB at most (`wav.MAX_WAV_FILE_BYTES`) that decodes, and resamples to the "
        "model's rate, to 2^28 samples at most (4.6 hours at 16 kHz; "
        "`wav.MAX_DECODED_SAMPLES`)."
    )


class MicSourceSpec(BaseModel):
    """An ALSA capture device, recorded with arecord."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["mic"] = Field("mic", description="Source kind.")
    device: str = Field(
        "default",
        description=f"Capture device, as `arecord -L` lists it: {ALSA_DEVICE_FORMS}.",
    )
    stall_timeout_s: float = Field(
        5.0, gt=0, description="Fail with a SourceError when no audio arrives for this long."
    )

    @field_validator("device")
    @classmethod
    def _plain_alsa_name(cls, value: str) -> str:
        if not is_alsa_device(value):
            raise ValueError(
                f"{value[:80]!r} is not a plain ALSA device name: give default, a PCM's name, "
                f"or {'/'.join(ALSA_CARD_PCMS)} with card arguments (hw:1,0, "
                "plughw:CARD=PCH,DEV=0): letters, digits, '_', ':', ',' and '=' only"
            )
        return value


AudioSourceSpec = Annotated[WavSourceSpec | MicSourceSpec, Field(discriminator="type")]


class RingBuffer:
    """A fixed-size float32 FIFO that overwrites its oldest samples when full.

    Not thread-safe: the owner serialises writes and reads.
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"ring buffer capacity must be positive; got {capacity}")
        self._data = np.zeros(capacity, dtype=np.float32)
        self._start = 0
        self._size = 0
        self.overwritten = 0
        """Samples lost because writes outran reads."""

    @property
    def capacity(self) -> int:
        return len(self._data)

    @property
    def available(self) -> int:
        """Samples waiting to be read."""
        return self._size

    def write(self, samples: FloatArray) -> None:
        """Append samples, dropping the oldest ones when the buffer is full."""
        new = np.asarray(samples, dtype=np.float32).ravel()
        cap = self.capacity
        if len(new) >= cap:
            self.overwritten += self._size + len(new) - cap
            self._data[:] = new[-cap:]
            self._start, self._size = 0, cap
            return
        excess = self._size + len(new) - cap
        if excess > 0:
            self.overwritten += excess
            self._start = (self._start + excess) % cap
            self._size -= excess
        end = (self._start + self._size) % cap
        first = min(len(new), cap - end)
        self._data[end : end + first] = new[:first]
        self._data[: len(new) - first] = new[first:]
        self._size += len(new)

    def read(self, n: int) -> FloatArray | None:
        """The oldest `n` samples, removed from the buffer; None while fewer are waiting."""
        if n > self._size:
            return None
        cap = self.capacity
        idx = (self._start + np.arange(n)) % cap
        out = self._data[idx]
        self._start = (self._start + n) % cap
        self._size -= n
        return out


class WavSource:
    """A WAV file, mixed to mono, resampled, and cut into hop-sample chunks."""

    def __init__(self, path: Path, sample_rate: int, hop: int) -> None:
        """Decode the whole file.

        Raises:
            SourceError: the file is missing or is not a WAV this reader decodes.
            EdgeAgentError: input.invalid for a device, a FIFO, or a file too large to be
                a recording (`wav.MAX_WAV_FILE_BYTES`), before it is read; for one longer
                than `wav.MAX_DECODED_SAMPLES` at `sample_rate`, before it is decoded.
        """
        try:
            wav = load_wav(path, sample_rate)
        except FileNotFoundError:
            raise SourceError(
                f"WAV file {path} does not exist", fix="check the path", code="source.unreachable"
            ) from None
        except OSError as exc:
            raise SourceError(
                f"cannot read WAV file {path}: {exc.strerror}",
                fix="check the file's permissions",
                code="source.unreachable",
            ) from None
        except WavError as exc:
            raise SourceError(
                f"cannot decode WAV file {path}: {exc}",
                fix="re-export it as PCM WAV, e.g. `sox in.wav -e signed -b 16 out.wav`",
                code="input.unreadable",
            ) from None
        self._path = path
        self._missing_s = wav.missing_s
        self._audio = resample(to_mono(wav.samples), wav.rate, sample_rate)
        self._rate = sample_rate
        self._hop = hop
        self._index = 0

    def read(self) -> AudioChunk | None:
        """The next `hop` samples (the last chunk padded with zeros); None at the end.

        Raises:
            SourceError: once, after the last chunk, when the file is shorter than its
                header says (a copy interrupted, a recorder killed mid-write).
        """
        start = time.perf_counter()
        begin = self._index * self._hop
        if begin >= len(self._audio):
            if self._missing_s > 0:
                missing, self._missing_s = self._missing_s, 0.0  # raise once, then end
                raise SourceError(
                    f"WAV file {self._path} ends {missing:.2f} s short of what its header "
                    f"declares, after {len(self._audio) / self._rate:.2f} s: it is truncated",
                    fix="re-copy the file, or re-export what is left with "
                    f"`sox --ignore-length {self._path} fixed.wav`",
                    code="source.failed",
                )
            return None
        samples = self._audio[begin : begin + self._hop]
        if len(samples) < self._hop:
            samples = np.pad(samples, (0, self._hop - len(samples)))
        chunk = AudioChunk(
            index=self._index,
            ts=begin / self._rate,
            samples=samples,
            read_s=time.perf_counter() - start,
        )
        self._index += 1
        return chunk

    @property
    def dropped(self) -> int:
        """Always 0: a file waits for its reader."""
        return 0

    def close(self) -> None:
        """Drop the decoded audio; safe to call twice."""
        self._audio = self._audio[:0]


class MicSource:
    """Live audio from `arecord`, buffered by a reader thread in a ring buffer."""

    def __init__(
        self,
        device: str,
        sample_rate: int,
        hop: int,
        stall_timeout_s: float,
        on_live: Callable[[], object] | None = None,
    ) -> None:
        """Start arecord.

        Args:
            device: the ALSA PCM.
            sample_rate: Hz.
            hop: samples per chunk.
            stall_timeout_s: how long `read` waits for audio before it fails.
            on_live: called once, on the reading thread, as the first chunk is read:
                the agent's outage record, which logs `source_recovered` for a mic that
                came back.

        Raises:
            SourceError: arecord is not installed or cannot be started.
            ValueError: `device` is not a plain ALSA name (`MicSourceSpec` refuses those).
        """
        if not is_alsa_device(device):
            raise ValueError(f"not a plain ALSA device name: {device!r}")
        exe = shutil.which("arecord")
        if exe is None:
            raise SourceError(
                "arecord is not installed", fix=_ARECORD_FIX, code="source.unreachable"
            )
        self._device = device
        self._rate = sample_rate
        self._hop = hop
        self._stall_s = stall_timeout_s
        self._on_live = on_live
        self._overrun_said = Throttle(_OVERRUN_LOG_EVERY_S)
        self._ring = RingBuffer(max(hop, int(sample_rate * _MIC_BUFFER_S)))
        self._cond = threading.Condition()
        self._index = 0
        self._ended = False
        self._closed = False
        # A file, not a pipe: nobody has to drain it while arecord runs.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (lives until close())
        # An argv, never a shell; the device cannot start with '-' (`is_alsa_device`).
        cmd = [exe, "-q", "-D", device, "-f", "S16_LE", "-c", "1", "-r", str(sample_rate)]
        cmd += ["-t", "raw"]
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr
            )
        except OSError as exc:
            self._stderr.close()
            raise SourceError(
                f"cannot start {exe}: {exc.strerror}", fix=_ARECORD_FIX, code="source.unreachable"
            ) from None
        self._thread = threading.Thread(target=self._pump, name=f"mic:{device}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Windows lost because the consumer fell more than the buffer behind, rounded up."""
        return -(-self._ring.overwritten // self._hop)

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        carry = b""
        said = 0  # samples lost by the last mic_overrun line
        while True:
            # os.read returns what the pipe holds now instead of waiting for a full block.
            data = os.read(fd, 8192)
            if not data:
                break
            data = carry + data
            # S16 samples are 2 bytes; a read can end halfway through one.
            usable = len(data) - len(data) % 2
            carry = data[usable:]
            samples = np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0
            with self._cond:
                before = self._ring.overwritten
                self._ring.write(samples)
                lost = self._ring.overwritten
                self._cond.notify()
            # Said at most once a minute, with the audio lost since: said once for the
            # source's life, the overruns after the first left no trace in the journal.
            if lost > before and self._overrun_said.ready():
                log_event(
                    log,
                    logging.WARNING,
                    "mic_overrun",
                    device=self._device,
                    lost_s=round((lost - said) / self._rate, 2),
                )
                said = lost
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def read(self) -> AudioChunk | None:
        """The next `hop` samples; None once closed.

        Raises:
            SourceError: arecord exited, or sent nothing for stall_timeout_s.
        """
        start = time.perf_counter()
        deadline = time.monotonic() + self._stall_s
        with self._cond:
            while True:
                samples = self._ring.read(self._hop)
                if samples is not None or self._closed or self._ended:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        if samples is None:
            if self._closed:
                return None
            raise self._failure()
        chunk = AudioChunk(
            index=self._index,
            ts=self._index * self._hop / self._rate,
            samples=samples,
            read_s=time.perf_counter() - start,
        )
        if self._index == 0 and self._on_live is not None:
            # Each retry of a lost mic is a new source: its first chunk is the mic's return.
            self._on_live()
        self._index += 1
        return chunk

    def _failure(self) -> SourceError:
        if not self._ended:
            return SourceError(
                f"no audio from ALSA device {self._device!r} for {self._stall_s:g} s",
                fix="check the device with `arecord -l` and that nothing else holds it",
                code="source.failed",
            )
        # Its output closes a moment before it exits; wait for the code and message.
        try:
            code: int | str = self._proc.wait(timeout=_STOP_S)
        except subprocess.TimeoutExpired:
            code = "unknown (closed its output)"
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        why = lines[-1] if lines else "no message"
        return SourceError(
            f"arecord exited with code {code} on device {self._device!r}: {why}",
            fix=f"check the device with `arecord -l`; if arecord is missing, {_ARECORD_FIX}",
            code="source.failed",
        )

    def close(self) -> None:
        """Stop arecord and the reader thread; safe to call twice."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=_STOP_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._thread.join(timeout=_STOP_S)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._stderr.close()


def open_audio_source(
    spec: AudioSourceSpec,
    sample_rate: int,
    hop: int,
    on_live: Callable[[], object] | None = None,
) -> AudioSource:
    """Open the audio source a spec describes, delivering `hop` new samples per chunk.

    Args:
        spec: which source.
        sample_rate: the model's rate, Hz; files are resampled to it, mics record at it.
        hop: new samples per chunk.
        on_live: for a mic, called as its first chunk is read (`MicSource`).

    Raises:
        SourceError: the file is missing or broken, or arecord is missing.
    """
    if sample_rate <= 0 or hop <= 0:
        raise ValueError(f"sample_rate and hop must be positive; got {sample_rate}, {hop}")
    if isinstance(spec, WavSourceSpec):
        return WavSource(spec.path, sample_rate, hop)
    return MicSource(spec.device, sample_rate, hop, spec.stall_timeout_s, on_live)
