"""Streaming voice-activity head for silero-style VAD models.

The model sees one window of audio at a time (plus a little context from the
previous window) and returns a speech probability; its recurrent state is fed
back by the runtime. This module turns that probability stream into speech
segments with the same hysteresis as silero's `get_speech_timestamps`, but one
window at a time so segments can be published as they close, and into a
speech timeline whose marks say when speech started and ended as soon as the
hysteresis has decided it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from edge_agent.audio.wav import MAX_RATE, MIN_RATE
from edge_agent.config_files import is_recorded
from edge_agent.heads.base import FloatArray, SpeechSegment


class VadConfig(BaseModel):
    """Tensor names, framing and hysteresis of a streaming VAD model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["vad"] = Field(default="vad", description="Head discriminator.")
    probability: str = Field(default="output", description="Output holding the speech probability.")
    state_in: str = Field(default="state", description="Input taking the recurrent state.")
    state_out: str = Field(default="stateN", description="Output giving the next recurrent state.")
    audio_input: str = Field(default="input", description="Input taking context plus window.")
    sample_rate: int = Field(
        default=16000,
        ge=MIN_RATE,
        le=MAX_RATE,
        description="Sample rate the model expects, Hz (1,000 to 384,000).",
    )
    window: int = Field(default=512, gt=0, description="New samples per model call.")
    context: int = Field(
        default=64, ge=0, description="Samples carried over from the previous window."
    )
    threshold: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Speech starts at this probability or above."
    )
    neg_threshold: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Speech may end below this probability; None means threshold - 0.15.",
    )
    min_speech_s: float = Field(
        default=0.25, ge=0.0, description="Drop speech segments shorter than this, seconds."
    )
    min_silence_s: float = Field(
        default=0.1, ge=0.0, description="Silence must last this long to end a segment, seconds."
    )
    speech_pad_s: float = Field(
        default=0.03, ge=0.0, description="Widen each segment by this much on both sides, seconds."
    )
    max_speech_s: float | None = Field(
        default=30.0,
        gt=0.0,
        description="Speech that goes on longer is cut into segments this long, seconds (None: "
        "never); a segment is sent when it closes, and a fan taken for a voice held one open "
        "for hours.",
    )

    @model_validator(mode="after")
    def _context_within_window(self, info: ValidationInfo) -> Self:
        # The pipeline carries the context from the last window alone: a longer one made
        # its inputs shorter than `infer`'s (and than the model's static shape). A release
        # an earlier build stored (`RECORDED`) is kept as it served.
        if self.context > self.window and not is_recorded(info):
            raise ValueError(
                f"the head's context ({self.context}) is more than its window "
                f"({self.window}): context is carried from the previous window alone"
            )
        return self


def audio_windows(samples: FloatArray, window: int, context: int) -> Iterator[FloatArray]:
    """Cut audio into model inputs of `context + window` samples.

    The first input starts with `context` zeros; each later one starts with the
    last `context` samples of the one before. The last window is zero-padded.

    Args:
        samples: mono audio, 1-D.
        window: new samples per input.
        context: samples repeated from the previous input.

    Returns:
        float32 arrays of length `context + window`, one per window.
    """
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"audio_windows wants mono 1-D audio; got shape {audio.shape}")
    count = -(-len(audio) // window)
    padded = np.zeros(context + count * window, dtype=np.float32)
    padded[context : context + len(audio)] = audio
    for k in range(count):
        yield padded[k * window : k * window + context + window]


@dataclass(frozen=True, slots=True)
class SpeechMark:
    """A point on a stream's speech timeline, in stream seconds, for event rules.

    Marks come in time order. `speaking=True` means speech is going on at `ts`
    (a confirmed segment, padded as its results are); `speaking=False` means
    the stream is known to be silent up to `ts`.
    """

    ts: float
    speaking: bool


@dataclass(frozen=True, slots=True)
class VadStep:
    """What one window (or the end of the stream) told the segmenter."""

    closed: list[SpeechSegment]
    """Segments that closed, as `push` returns them."""
    marks: list[SpeechMark]
    """New points on the speech timeline, for real-time events."""


class VadSegmenter:
    """Turns per-window speech probabilities into speech segments and a speech timeline.

    Segments come out when they close. The timeline (`step`) says when speech
    starts as soon as it has lasted `min_speech_s`, stamped with the segment's
    padded start, and when it ends as soon as `min_silence_s` of quiet confirms
    it, stamped with the padded end: the same hysteresis, so a start mark is
    always followed by a segment, and no later than the segment closes.
    """

    def __init__(self, config: VadConfig) -> None:
        self.config = config
        # Silero floors the derived threshold so a low `threshold` still lets speech end.
        self._neg_threshold = (
            config.neg_threshold
            if config.neg_threshold is not None
            else max(config.threshold - 0.15, 0.01)
        )
        rate = config.sample_rate
        self._min_speech = config.min_speech_s * rate
        self._min_silence = config.min_silence_s * rate
        self._pad = config.speech_pad_s * rate
        self._max_speech = (
            config.max_speech_s * rate if config.max_speech_s is not None else math.inf
        )
        self._reset()

    def _reset(self) -> None:
        self._seen = 0  # the stream position just past the last window
        self._start: int | None = None
        self._candidate_end: int | None = None
        self._confirmed = False
        self._continued = False  # the open segment goes on from one cut at max_speech_s
        # Padding must not make a segment reach back into the one before it.
        self._last_end = 0.0
        self._last_mark = 0.0
        self._marks: list[SpeechMark] = []

    def push(self, probability: float) -> list[SpeechSegment]:
        """Feed the next window's speech probability.

        Returns:
            The segment that closed with this window, if any.
        """
        return self.step(probability).closed

    def flush(self) -> list[SpeechSegment]:
        """End the stream: close any open segment, then start afresh for a new stream.

        Returns:
            The segment that was open, if long enough.
        """
        return self.finish().closed

    def step(self, probability: float, at: int | None = None) -> VadStep:
        """Feed the next window's speech probability; see `VadStep` for what comes back.

        Args:
            at: the window's first sample in the stream, when the source lost audio before
                it (a microphone's overrun); None: just after the last window.
        """
        window = self.config.window
        position = self._seen if at is None else max(at, self._seen)
        self._seen = position + window
        closed: list[SpeechSegment] = []
        if probability >= self.config.threshold:
            self._candidate_end = None
            if self._start is None:
                self._start = position
            self._speech_through(position + window)
        elif self._start is None:
            # Known silent, except as far back as a later segment's padding may reach.
            self._mark(position + window - self._pad, speaking=False)
        elif probability >= self._neg_threshold:
            if self._candidate_end is None:
                self._speech_through(position + window)
        else:
            if self._candidate_end is None:
                self._candidate_end = position
            # Measured from the start of the first quiet window to the start of this one,
            # as silero.
            if position - self._candidate_end >= self._min_silence:
                closed = self._close(self._candidate_end, ended=True)
        start = self._start
        if start is not None and self._confirmed and self._seen - start >= self._max_speech:
            # Cut, not ended: the speech goes on, in a segment of its own from here, so the
            # timeline says nothing of silence and event rules see no departure.
            closed = self._close(self._seen, ended=False)
            self._start, self._confirmed, self._continued = self._seen, True, True
        return self._step(closed)

    def finish(self) -> VadStep:
        """End the stream, as `flush`, with the last marks; then start afresh."""
        closed: list[SpeechSegment] = []
        if self._start is not None:
            # Trailing quiet too short to confirm is still not speech.
            end = self._candidate_end
            # Speech still going when the stream stops has not ended: no end mark.
            closed = self._close(end if end is not None else self._seen, ended=end is not None)
        step = self._step(closed)
        self._reset()
        return step

    def _step(self, closed: list[SpeechSegment]) -> VadStep:
        marks, self._marks = self._marks, []
        return VadStep(closed, marks)

    def _mark(self, samples: float, *, speaking: bool) -> None:
        # Never back in time: event rules read a step backwards as a restarted stream.
        ts = max(samples / self.config.sample_rate, self._last_mark)
        self._last_mark = ts
        self._marks.append(SpeechMark(ts, speaking))

    def _padded_start(self, start: int) -> float:
        # Never clamp past the segment's own start: that would eat real speech.
        return max(start - self._pad, min(self._last_end, start), 0.0)

    def _speech_through(self, end: int) -> None:
        """Speech runs on to sample `end`: confirm it once it is long enough to keep."""
        start = self._start
        assert start is not None
        if not self._confirmed:
            if end - start < self._min_speech:
                # Too short to keep yet; the stream was silent up to its padded start.
                self._mark(self._padded_start(start), speaking=False)
                return
            # Every later end is at or past `end`, so a confirmed segment is never dropped.
            self._confirmed = True
            self._mark(self._padded_start(start), speaking=True)
        self._mark(end, speaking=True)

    def _close(self, end: int, *, ended: bool) -> list[SpeechSegment]:
        start = self._start
        continued = self._continued
        self._start = None
        self._candidate_end = None
        self._confirmed = self._continued = False
        if start is None:
            return []
        if continued and end <= start:
            # The speech stopped right at the cut: the segment before it ended there.
            if ended:
                self._mark(start, speaking=False)
            return []
        # What follows a cut is kept however short: it is the end of speech long enough.
        if end - start < self._min_speech and not continued:
            return []
        padded_start = self._padded_start(start)
        padded_end = min(end + self._pad, self._seen)
        self._last_end = padded_end
        # Kept means confirmed: a segment long enough to keep was long enough at its last
        # speech window, which confirmed it and marked its start.
        self._mark(padded_end, speaking=True)
        if ended:
            self._mark(padded_end, speaking=False)
        rate = self.config.sample_rate
        return [SpeechSegment(start=padded_start / rate, end=padded_end / rate)]
