"""Resampling keeps tones in band, removes tones that would alias, and gets lengths right."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.audio.resample import resample

RATES = [8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000]
EDGE = 0.1  # seconds left out at each end, where the filter sees the zeros beyond the clip


def tone(freq: float, rate: int, seconds: float = 2.0) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate).astype(np.float32)


def inner(x: np.ndarray, rate: int) -> np.ndarray:
    cut = int(EDGE * rate)
    return x[cut:-cut]


def rms_db(x: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.square(x, dtype=np.float64)))))


def peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[spectrum.argmax()])


@pytest.mark.parametrize("from_rate", [44100, 48000, 22050, 8000])
def test_440_hz_keeps_its_pitch_and_level(from_rate: int) -> None:
    y = inner(resample(tone(440, from_rate), from_rate, 16000), 16000)
    assert abs(peak_hz(y, 16000) - 440) <= 1.0
    assert abs(rms_db(y) - rms_db(tone(440, 16000))) < 0.1


@pytest.mark.parametrize("from_rate", [44100, 48000, 22050])
def test_tone_above_new_nyquist_is_removed_not_aliased(from_rate: int) -> None:
    x = tone(10_000, from_rate)
    y = inner(resample(x, from_rate, 16000), 16000)
    assert rms_db(y) - rms_db(x) < -20


def test_tone_below_new_nyquist_survives() -> None:
    x = tone(7_000, 44100)
    y = inner(resample(x, 44100, 16000), 16000)
    assert rms_db(y) - rms_db(x) > -3
    assert abs(peak_hz(y, 16000) - 7000) <= 1.0


def test_upsampling_adds_no_images() -> None:
    y = inner(resample(tone(440, 8000), 8000, 16000), 16000)
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    freqs = np.fft.rfftfreq(len(y), 1 / 16000)
    # The image of 440 Hz would sit at 8000 - 440 Hz.
    assert spectrum[freqs > 4000].max() < spectrum.max() * 1e-3


def test_equal_rates_return_a_copy() -> None:
    x = tone(440, 16000, 0.1)
    y = resample(x, 16000, 16000)
    np.testing.assert_array_equal(y, x)
    y[0] = 5.0
    assert x[0] != 5.0


def test_constant_stays_constant() -> None:
    y = inner(resample(np.full(44100, 0.5, np.float32), 44100, 16000), 16000)
    np.testing.assert_allclose(y, 0.5, atol=1e-4)


@given(st.integers(0, 5000), st.sampled_from(RATES), st.sampled_from(RATES))
def test_length_is_rounded_ratio(length: int, from_rate: int, to_rate: int) -> None:
    x = np.random.default_rng(length).uniform(-1, 1, length).astype(np.float32)
    y = resample(x, from_rate, to_rate)
    assert y.dtype == np.float32
    assert len(y) == round(Fraction(length * to_rate, from_rate))
    # A windowed sinc overshoots a little, never wildly.
    assert np.all(np.abs(y) < 2.0)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="mono"):
        resample(np.zeros((10, 2), np.float32), 44100, 16000)
    with pytest.raises(ValueError, match="positive"):
        resample(np.zeros(10, np.float32), 0, 16000)
