"""VAD windowing and hysteresis on synthetic probability streams."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.heads.base import SpeechSegment
from edge_agent.heads.vad import (
    SpeechMark,
    VadConfig,
    VadSegmenter,
    audio_windows,
)

CONFIG = VadConfig()
W = CONFIG.window / CONFIG.sample_rate  # 32 ms per window
PAD = CONFIG.speech_pad_s


def run(probs: list[float], config: VadConfig = CONFIG) -> list[SpeechSegment]:
    segmenter = VadSegmenter(config)
    segments = [s for p in probs for s in segmenter.push(p)]
    return segments + segmenter.flush()


def test_two_utterances_give_two_padded_segments() -> None:
    probs = [0.0] * 10 + [0.9] * 20 + [0.0] * 20 + [0.9] * 20 + [0.0] * 10
    first, second = run(probs)
    assert first.start == pytest.approx(10 * W - PAD)
    assert first.end == pytest.approx(30 * W + PAD)
    assert second.start == pytest.approx(50 * W - PAD)
    assert second.end == pytest.approx(70 * W + PAD)


def test_segment_closes_once_silence_is_confirmed() -> None:
    segmenter = VadSegmenter(CONFIG)
    for p in [0.9] * 20:
        assert segmenter.push(p) == []
    closed_after = None
    for quiet in range(1, 20):
        if segmenter.push(0.0):
            closed_after = quiet
            break
    assert closed_after is not None
    # Not before min_silence_s of quiet, and within one window of it.
    assert CONFIG.min_silence_s <= closed_after * W <= CONFIG.min_silence_s + 2 * W
    assert segmenter.flush() == []


def test_short_blips_are_dropped() -> None:
    blip = math.floor(CONFIG.min_speech_s / W) - 1
    assert run([0.0] * 10 + [0.9] * blip + [0.0] * 20) == []


def test_gaps_shorter_than_min_silence_are_merged() -> None:
    gap = math.floor(CONFIG.min_silence_s / W) - 1
    [segment] = run([0.9] * 20 + [0.0] * gap + [0.9] * 20 + [0.0] * 10)
    assert segment.end == pytest.approx((40 + gap) * W + PAD)


def test_resumed_speech_cancels_the_candidate_end() -> None:
    gap = math.floor(CONFIG.min_silence_s / W) - 1
    # Two short gaps separated by one speech window: together they exceed min_silence_s.
    probs = [0.9] * 10 + [0.0] * gap + [0.9] + [0.0] * gap + [0.9] * 10 + [0.0] * 10
    assert len(run(probs)) == 1


def test_hysteresis_between_thresholds() -> None:
    middle = 0.4  # below threshold 0.5, above the derived 0.35
    [segment] = run([0.9] * 10 + [middle] * 30 + [0.0] * 10)
    assert segment.end == pytest.approx(40 * W + PAD)
    assert run([middle] * 50) == []


def test_explicit_neg_threshold() -> None:
    config = VadConfig(neg_threshold=0.45)
    [segment] = run([0.9] * 10 + [0.4] * 30, config)
    assert segment.end == pytest.approx(10 * W + PAD)


def test_flush_closes_open_speech_at_stream_end() -> None:
    [segment] = run([0.9] * 20)
    assert segment.start == 0.0  # padding is clamped at the start of the stream
    assert segment.end == pytest.approx(20 * W)  # and never runs past its end


def test_unconfirmed_trailing_quiet_is_not_speech() -> None:
    [segment] = run([0.9] * 20 + [0.0] * 2)
    assert segment.end == pytest.approx(20 * W + PAD)


def test_flush_starts_a_new_stream() -> None:
    segmenter = VadSegmenter(CONFIG)
    for p in [0.0] * 30 + [0.9] * 20:
        segmenter.push(p)
    assert len(segmenter.flush()) == 1
    for p in [0.9] * 20:
        segmenter.push(p)
    [again] = segmenter.flush()
    assert again.start == 0.0


@given(
    st.lists(st.floats(0.0, 1.0), max_size=300),
    st.floats(0.0, 0.2),
    st.floats(0.0, 0.3),
    st.floats(0.0, 0.5),
)
def test_segments_are_ordered_and_inside_the_stream(
    probs: list[float], pad: float, silence: float, speech: float
) -> None:
    config = VadConfig(speech_pad_s=pad, min_silence_s=silence, min_speech_s=speech)
    segments = run(probs, config)
    total = len(probs) * W
    for s in segments:
        assert 0.0 <= s.start < s.end <= total + 1e-9
        assert s.end - s.start >= speech - 1e-9
    if pad <= silence:
        for before, after in pairwise(segments):
            assert before.end <= after.start + 1e-9


def timeline(
    probs: list[float], config: VadConfig = CONFIG
) -> tuple[list[tuple[int, SpeechMark]], list[SpeechSegment]]:
    """Marks with the index of the window that produced them (len(probs) for the end)."""
    segmenter = VadSegmenter(config)
    marks: list[tuple[int, SpeechMark]] = []
    segments: list[SpeechSegment] = []
    for k, p in enumerate(probs):
        step = segmenter.step(p)
        marks += [(k, m) for m in step.marks]
        segments += step.closed
    end = segmenter.finish()
    return marks + [(len(probs), m) for m in end.marks], segments + end.closed


def edges(marks: list[tuple[int, SpeechMark]]) -> list[tuple[str, int, float]]:
    """(kind, window it was known at, ts) for each change of speaking state."""
    out: list[tuple[str, int, float]] = []
    speaking = False
    for k, m in marks:
        if m.speaking != speaking:
            speaking = m.speaking
            out.append(("start" if speaking else "end", k, m.ts))
    return out


def test_timeline_says_start_and_end_as_soon_as_the_hysteresis_decides() -> None:
    marks, [segment] = timeline([0.0] * 10 + [0.9] * 20 + [0.0] * 20)
    (start, known_start, start_ts), (end, known_end, end_ts) = edges(marks)
    assert (start, end) == ("start", "end")
    # Stamped with the segment's own padded edges...
    assert start_ts == pytest.approx(segment.start) == pytest.approx(10 * W - PAD)
    assert end_ts == pytest.approx(segment.end) == pytest.approx(30 * W + PAD)
    # ...and known once speech lasted min_speech_s and silence min_silence_s, not later.
    assert known_start == 10 + math.ceil(CONFIG.min_speech_s / W) - 1
    assert known_end == 30 + math.ceil(CONFIG.min_silence_s / W)


def test_timeline_ignores_blips_and_keeps_speech_open_at_stream_end() -> None:
    blip = math.floor(CONFIG.min_speech_s / W) - 1
    marks, _ = timeline([0.0] * 10 + [0.9] * blip + [0.0] * 20 + [0.9] * 20)
    # The blip never starts speech; speech still going at the end never ends.
    assert [kind for kind, _, _ in edges(marks)] == ["start"]


@given(
    st.lists(st.floats(0.0, 1.0), max_size=300),
    st.floats(0.0, 0.2),
    st.floats(0.0, 0.3),
    st.floats(0.0, 0.5),
    st.one_of(st.none(), st.floats(0.2, 3.0)),
)
def test_timeline_agrees_with_the_segments(
    probs: list[float], pad: float, silence: float, speech: float, longest: float | None
) -> None:
    config = VadConfig(
        speech_pad_s=pad, min_silence_s=silence, min_speech_s=speech, max_speech_s=longest
    )
    marks, cut = timeline(probs, config)
    said_end = {ts for kind, _, ts in edges(marks) if kind == "end"}
    # Speech cut at max_speech_s goes on: the timeline sees one stretch where a segment
    # starts at the end of the one before with no end said there.
    segments: list[SpeechSegment] = []
    for s in cut:
        if longest is not None:
            assert s.end - s.start <= longest + W + pad + 1e-9
        if segments and s.start == segments[-1].end and s.start not in said_end:
            segments[-1] = SpeechSegment(start=segments[-1].start, end=s.end)
        else:
            segments.append(s)
    stamps = [m.ts for _, m in marks]
    assert stamps == sorted(stamps)
    found = edges(marks)
    starts = [ts for kind, _, ts in found if kind == "start"]
    ends = [ts for kind, _, ts in found if kind == "end"]
    # Every segment was announced at its start, and at its end unless the stream's end
    # cut it off while speech went on.
    assert starts == pytest.approx([s.start for s in segments])
    assert ends in (
        pytest.approx([s.end for s in segments]),
        pytest.approx([s.end for s in segments[:-1]]),
    )


def test_speech_longer_than_max_speech_s_is_cut_with_no_departure() -> None:
    # A fan taken for a voice held one segment open for hours: nothing was sent until it
    # closed. It is cut every max_speech_s, and the timeline says nothing of silence.
    config = VadConfig(max_speech_s=1.0)
    marks, segments = timeline([0.0] * 10 + [0.9] * 100 + [0.0] * 20, config)
    start, end = 10 * W - PAD, 110 * W + PAD
    assert [kind for kind, _, _ in edges(marks)] == ["start", "end"]
    assert segments[0].start == pytest.approx(start)
    assert segments[-1].end == pytest.approx(end)
    assert len(segments) == 4  # three cut at 32 windows (1.024 s), and the last 0.16 s kept
    for before, after in pairwise(segments):
        assert before.end == pytest.approx(after.start)
        assert before.end - before.start == pytest.approx(
            32 * W + (PAD if before is segments[0] else 0)
        )
    # Speech that runs to the stream's end is cut the same way.
    assert len(run([0.9] * 100, config)) == 4
    assert len(run([0.9] * 100)) == 1  # the 30 s default


def test_a_window_after_lost_audio_is_placed_where_it_is() -> None:
    # A microphone's overrun loses audio between two windows; counted in windows, every
    # segment after it was early by what was lost.
    segmenter = VadSegmenter(CONFIG)
    window = CONFIG.window
    for k in range(10):
        segmenter.step(0.0, k * window)
    gap = 5 * CONFIG.sample_rate  # 5 s lost
    closed: list[SpeechSegment] = []
    for k in range(10, 30):
        closed += segmenter.step(0.9, gap + k * window).closed
    for k in range(30, 50):
        closed += segmenter.step(0.0, gap + k * window).closed
    [segment] = closed
    assert segment.start == pytest.approx(5 + 10 * W - PAD)
    assert segment.end == pytest.approx(5 + 30 * W + PAD)


def test_audio_windows_carry_context() -> None:
    x = np.arange(1, 1001, dtype=np.float32)
    first, second = audio_windows(x, 512, 64)
    assert first.shape == second.shape == (576,)
    assert not first[:64].any()
    np.testing.assert_array_equal(first[64:], x[:512])
    np.testing.assert_array_equal(second[:64], x[448:512])
    np.testing.assert_array_equal(second[64 : 64 + 488], x[512:])
    assert not second[64 + 488 :].any()


@given(st.integers(0, 3000), st.integers(1, 600), st.integers(0, 128))
def test_audio_windows_cover_everything(length: int, window: int, context: int) -> None:
    x = np.random.default_rng(length).uniform(-1, 1, length).astype(np.float32)
    chunks = list(audio_windows(x, window, context))
    assert len(chunks) == -(-length // window)
    assert all(c.shape == (context + window,) and c.dtype == np.float32 for c in chunks)
    joined = np.concatenate([c[context:] for c in chunks]) if chunks else np.zeros(0)
    np.testing.assert_array_equal(joined[:length], x)
    assert not joined[length:].any()
    for before, after in pairwise(chunks):
        np.testing.assert_array_equal(after[:context], before[len(before) - context :])


def test_audio_windows_want_mono() -> None:
    with pytest.raises(ValueError, match="mono"):
        list(audio_windows(np.zeros((100, 2), np.float32), 512, 64))
