"""Saying honestly which precision a model runs at, and why not the one asked for.

Pure: the engine's answers (what it runs, what the device can do) come in as
arguments. Engines substitute precisions silently: OpenVINO's CPU plugin runs
an f16 request at bf16 on a CPU without f16 arithmetic, and ONNX Runtime's CPU
provider computes in f32 whatever is asked. A benchmark or a calibration gate
read without that note compares the wrong things.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# OpenVINO's OPTIMIZATION_CAPABILITIES names for our precision names.
_CAPABILITY = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}


def combine(per_device: Mapping[str, str]) -> str:
    """One precision for several devices: 'bf16' when they agree, 'CPU:bf16,GPU:f16' if not."""
    values = set(per_device.values())
    if len(values) == 1:
        return values.pop()
    return ",".join(f"{device}:{used}" for device, used in per_device.items())


def precision_note(
    requested: str | None,
    per_device: Mapping[str, str],
    capabilities: Mapping[str, Sequence[str]],
) -> str:
    """Why the precision used differs from `requested`; empty when it was honoured.

    Args:
        requested: f32, bf16 or f16; None keeps each device's default, which needs no note.
        per_device: the precision each executing device reports after compile.
        capabilities: each device's OPTIMIZATION_CAPABILITIES, as OpenVINO lists them
            (missing or empty when the device does not say).
    """
    if requested is None:
        return ""
    notes = []
    for device, used in per_device.items():
        if used == requested:
            continue
        caps = [c for c in capabilities.get(device, ()) if c in _CAPABILITY.values()]
        if caps and _CAPABILITY.get(requested) not in caps:
            why = f"{device} has no {requested} arithmetic (it computes in {', '.join(caps)})"
        else:
            why = f"{device} did not apply the {requested} hint to this model"
        notes.append(f"{requested} requested, {device} runs {used}: {why}")
    return "; ".join(notes)
