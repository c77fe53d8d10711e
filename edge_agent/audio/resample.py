"""Band-limited sample-rate conversion for bringing audio to a model's rate.

A polyphase windowed-sinc filter: each output sample is a Kaiser-windowed sinc
interpolation of the input, with the cutoff lowered to the output's Nyquist
frequency when downsampling, so nothing above it folds back as alias.
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil, gcd

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]

# Zero crossings of the sinc on each side: longer is sharper and slower.
_ZEROS = 16
# Cutoff as a fraction of the lower Nyquist frequency; the rest is transition band.
_ROLLOFF = 0.92
# Kaiser shape: about 80 dB of stopband attenuation.
_BETA = 8.0
# Outputs computed per gather, to bound the [block, taps] working array.
_BLOCK = 8192


def _phase_filters(up: int, cutoff: float, half: int) -> npt.NDArray[np.float64]:
    """Filter taps for each of the `up` fractional positions between input samples.

    Row p weighs inputs at offsets -half+1 .. half from the input sample just
    before the output's position, which lies p/up of the way to the next one.
    """
    offsets = np.arange(-half + 1, half + 1, dtype=np.float64)
    distance = np.arange(up, dtype=np.float64)[:, None] / up - offsets[None, :]
    u = np.clip(distance / half, -1.0, 1.0)
    window = np.i0(_BETA * np.sqrt(1.0 - u**2)) / np.i0(_BETA)
    taps = cutoff * np.sinc(cutoff * distance) * window
    # Unit gain per phase, so silence stays silent and DC does not ripple between phases.
    return np.asarray(taps / taps.sum(axis=1, keepdims=True), dtype=np.float64)


def resample(samples: FloatArray, from_rate: int, to_rate: int) -> FloatArray:
    """Convert mono audio from one sample rate to another without aliasing.

    Args:
        samples: mono audio, 1-D.
        from_rate: its sample rate, Hz.
        to_rate: the rate wanted, Hz.

    Returns:
        float32 audio of `round(len(samples) * to_rate / from_rate)` samples; a copy of
        the input when the rates are equal.
    """
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"resample wants mono 1-D audio; got shape {audio.shape}")
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive; got {from_rate} -> {to_rate}")
    if from_rate == to_rate:
        return audio.copy()

    common = gcd(from_rate, to_rate)
    up, down = to_rate // common, from_rate // common
    count = round(Fraction(len(audio) * to_rate, from_rate))
    cutoff = _ROLLOFF * min(1.0, to_rate / from_rate)
    half = ceil(_ZEROS / cutoff)
    filters = _phase_filters(up, cutoff, half)

    # Zeros beyond both ends stand in for the silence before and after the clip.
    padded = np.zeros(len(audio) + 2 * half + 1, dtype=np.float64)
    padded[half : half + len(audio)] = audio
    taps = np.arange(2 * half)
    out = np.empty(count, dtype=np.float32)
    for first in range(0, count, _BLOCK):
        n = np.arange(first, min(first + _BLOCK, count), dtype=np.int64)
        base, phase = np.divmod(n * down, up)
        # Input index base - half + 1 + j sits at padded index base + 1 + j.
        window = padded[(base + 1)[:, None] + taps[None, :]]
        out[first : first + len(n)] = np.einsum("ij,ij->i", window, filters[phase])
    return out
