"""Audio sources: WAV files and ALSA microphones, cut into `hop`-sample chunks.

The microphone is captured with `arecord` (alsa-utils) in a subprocess rather than
a Python audio binding: it is on every Linux box, needs no wheel, and a crash in
the sound stack takes down arecord, not the agent.
"""

from __future__ import annotations

import logging
import os
import re
import selectors
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator

from edge_agent.audio.resample import resample
from edge_agent.audio.wav import WavError, load_wav, to_mono
from edge_agent.logs import Throttle, log_crash, log_event
from edge_agent.pipelines.base import AudioChunk, AudioSource, SourceError

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]

_ARECORD_FIX = "install it with `apt-get install alsa-utils` and list devices with `arecord -l`"
# Seconds of audio the mic keeps when the consumer falls behind; older samples go.
_MIC_BUFFER_S = 10.0
_STOP_S = 2.0
# arecord's stderr kept for a failure's message: the last lines, each cut to this length.
_ARECORD_LINES = 8
_ARECORD_LINE_CHARS = 300
# alsa-utils aplay.c set_params, when snd_pcm_hw_params_set_rate_near moved the rate by
# more than 5 %: "Warning: rate is not accurate (requested = %iHz, got = %iHz)".
_RATE_WARNING = re.compile(r"rate is not accurate \(requested = \d+ ?Hz, got = (?P<got>\d+) ?Hz\)")
_PLUG_FIX = "a raw hw:, dsnoop: or front: device takes only its card's own rates and channels"
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
        self.written = 0
        """Samples written, ever: the stream position just past the newest."""

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
        self.written += len(new)
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

    @property
    def position(self) -> int:
        """The stream position of the oldest sample waiting (what was overwritten counts)."""
        return self.written - self._size

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


class ArecordLog:
    """What arecord says on stderr: its last lines, and the rate it got if not the one asked.

    Without `-q` arecord warns when a device cannot record at the rate asked (a raw
    `hw:` or `dsnoop:` PCM fixed at 48 kHz) and then records at the device's rate
    regardless; with `-q` it said nothing, and 48 kHz audio was taken for 16 kHz.
    """

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=_ARECORD_LINES)
        self._partial = b""
        self.got_rate: int | None = None
        """The rate arecord records at, when it warned it is not the one asked."""

    @property
    def last(self) -> str:
        """Its last line worth saying (not the banner), or "no message"."""
        return self._lines[-1] if self._lines else "no message"

    def feed(self, data: bytes) -> None:
        """Take the next bytes of its stderr."""
        *lines, partial = (self._partial + data).split(b"\n")
        # A line never ended is cut, not kept growing.
        self._partial = partial[-_ARECORD_LINE_CHARS:]
        for raw in lines:
            line = raw.decode(errors="replace").strip()[:_ARECORD_LINE_CHARS]
            found = _RATE_WARNING.search(line)
            if found is not None:
                self.got_rate = int(found["got"])
            # Its banner ("Recording raw data 'stdin' : ...") says nothing of a failure.
            if line and not line.startswith("Recording "):
                self._lines.append(line)


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
        self._said = ArecordLog()
        # An argv, never a shell; the device cannot start with '-' (`is_alsa_device`). Not
        # `-q`: that hid the warning that the device records at another rate (ArecordLog).
        cmd = [exe, "-D", device, "-f", "S16_LE", "-c", "1", "-r", str(sample_rate)]
        cmd += ["-t", "raw"]
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Its messages untranslated, so the rate warning is found in any locale.
                env={**os.environ, "LC_ALL": "C"},
            )
        except OSError as exc:
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
        # One thread reads both pipes, so a chatty arecord never blocks on a full stderr.
        assert self._proc.stdout is not None
        assert self._proc.stderr is not None
        out, err = self._proc.stdout.fileno(), self._proc.stderr.fileno()
        try:
            with selectors.DefaultSelector() as pipes:
                pipes.register(out, selectors.EVENT_READ)
                pipes.register(err, selectors.EVENT_READ)
                self._pump_pipes(pipes, out, err)
        except Exception:
            # Ended either way: a reader that died unmarked left `read` to wait out its
            # stall timeout and say "no audio", not what went wrong.
            if not self._closed:
                log_crash(log, "mic_reader_failed", device=self._device)
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def _pump_pipes(self, pipes: selectors.BaseSelector, out: int, err: int) -> None:
        carry = b""
        said = 0  # samples lost by the last mic_overrun line
        while pipes.get_map():
            # Once its audio has ended, its last words are waited for only so long.
            ready = {key.fd for key, _ in pipes.select(None if out in pipes.get_map() else _STOP_S)}
            if not ready:
                return
            # stderr first: arecord warns of the rate it got before it sends any audio.
            if err in ready:
                # os.read returns what the pipe holds now instead of waiting for a block.
                text = os.read(err, 4096)
                if not text:
                    pipes.unregister(err)
                self._said.feed(text or b"\n")  # a last line left unended is a line
                if self._said.got_rate is not None:
                    return  # its audio is at another rate: none of it is taken
            if out not in ready:
                continue
            data = os.read(out, 8192)
            if not data:
                pipes.unregister(out)
                continue
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

    def read(self) -> AudioChunk | None:
        """The next `hop` samples; None once closed.

        Raises:
            SourceError: arecord exited, or sent nothing for stall_timeout_s.
        """
        start = time.perf_counter()
        deadline = time.monotonic() + self._stall_s
        with self._cond:
            while True:
                at = self._ring.position
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
            # Where the samples are in the stream: counting chunks, every chunk after an
            # overrun was stamped early by the audio lost, and events said speech came
            # before it did.
            ts=at / self._rate,
            samples=samples,
            read_s=time.perf_counter() - start,
        )
        if self._index == 0 and self._on_live is not None:
            # Each retry of a lost mic is a new source: its first chunk is the mic's return.
            self._on_live()
        self._index += 1
        return chunk

    def _failure(self) -> SourceError:
        got = self._said.got_rate
        if got is not None:
            plug = f"plug{self._device}" if self._device.startswith("hw:") else "plughw:N,M"
            return SourceError(
                f"ALSA device {self._device!r} records at {got} Hz, not the {self._rate} Hz "
                "the model takes (arecord: rate is not accurate)",
                fix=f"{_PLUG_FIX}: give {plug}, which converts the rate, or default",
                code="source.unreachable",
            )
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
        return SourceError(
            f"arecord exited with code {code} on device {self._device!r}: {self._said.last}",
            fix="check the device with `arecord -l`; "
            f"{_PLUG_FIX} ({self._rate} Hz mono S16_LE is asked): give plughw:N,M or default",
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
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()


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
