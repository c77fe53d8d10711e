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
# Filter taps held at once, in the phase table or a block's [outputs, taps] arrays.
# Co-prime rates (383999 -> 16000 Hz) would want one phase per output rate step, a
# table of GiBs; past this bound the phases are rounded to the nearest of fewer ones.
_MAX_TAPS = 1 << 20
# Largest up- or downsampling factor: the output (or the filter) grows with it, and a
# damaged header (1 Hz, 4 GHz) must fail here rather than allocate until killed.
MAX_RATIO = 1024


def _phase_filters(phases: int, cutoff: float, half: int) -> npt.NDArray[np.float64]:
    """Filter taps for each of `phases` evenly spaced positions between input samples.

    Row p weighs inputs at offsets -half+1 .. half from the input sample just
    before the output's position, which lies p/phases of the way to the next one.
    """
    offsets = np.arange(-half + 1, half + 1, dtype=np.float64)
    distance = np.arange(phases, dtype=np.float64)[:, None] / phases - offsets[None, :]
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

    Raises:
        ValueError: the audio is not 1-D, a rate is not positive, or one rate is more
            than `MAX_RATIO` times the other.
    """
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"resample wants mono 1-D audio; got shape {audio.shape}")
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive; got {from_rate} -> {to_rate}")
    if max(from_rate, to_rate) > MAX_RATIO * min(from_rate, to_rate):
        raise ValueError(
            f"cannot resample {from_rate} Hz to {to_rate} Hz: one rate is more than "
            f"{MAX_RATIO} times the other"
        )
    if from_rate == to_rate:
        return audio.copy()

    common = gcd(from_rate, to_rate)
    up, down = to_rate // common, from_rate // common
    count = round(Fraction(len(audio) * to_rate, from_rate))
    cutoff = _ROLLOFF * min(1.0, to_rate / from_rate)
    half = ceil(_ZEROS / cutoff)
    phases = max(1, min(up, _MAX_TAPS // (2 * half)))
    filters = _phase_filters(phases, cutoff, half)
    block = max(1, min(_BLOCK, _MAX_TAPS // (2 * half)))

    # Zeros beyond both ends stand in for the silence before and after the clip.
    # float32 as the input is: float64 held it twice over, and added no precision to it.
    padded = np.zeros(len(audio) + 2 * half + 1, dtype=np.float32)
    padded[half : half + len(audio)] = audio
    taps = np.arange(2 * half)
    out = np.empty(count, dtype=np.float32)
    for first in range(0, count, block):
        n = np.arange(first, min(first + block, count), dtype=np.int64)
        base, phase = np.divmod(n * down, up)
        if phases < up:
            # Rounding can reach the next input sample's phase 0, which is the same
            # position as the last phase + 1 step; fold it over to keep indices in range.
            phase = (phase * phases + up // 2) // up
            base += phase // phases
            phase %= phases
        # Input index base - half + 1 + j sits at padded index base + 1 + j.
        window = padded[(base + 1)[:, None] + taps[None, :]]
        out[first : first + len(n)] = np.einsum("ij,ij->i", window, filters[phase])
    return out
