"""A `CompileReport` in words: where a model really runs, at what precision, and why.

The runtime decides the device and precision; these only say it, the same way
in every command (bench's table, run-pipeline's start line and live table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_agent.runtime.base import CompileReport


def precision_text(report: CompileReport) -> str:
    """'bf16 (device default)', 'f32', or 'bf16 (f16 requested, CPU runs bf16: ...)'."""
    if report.precision_note:
        return f"{report.precision} ({report.precision_note})"
    if report.precision_requested is None:
        # Timings mean little without it: OpenVINO picks bf16 on CPUs that have it.
        return f"{report.precision} (device default)"
    return report.precision


def fallbacks_text(report: CompileReport) -> str:
    """'GPU: no such device; NPU: driver missing', or '' when the first choice was used."""
    return "; ".join(f"{f.device}: {f.reason}" for f in report.fallbacks)


def start_line(model: str, report: CompileReport) -> str:
    """The one line run-pipeline prints before the first frame."""
    line = (
        f"edge-agent: {model} runs on {report.backend} {report.device}"
        f" at {precision_text(report)}, hint {report.hint} x{report.requests}"
    )
    if report.fallbacks:
        line += f"; asked for {report.requested}, passed over {fallbacks_text(report)}"
    return line


def needs_attention(report: CompileReport) -> bool:
    """The model does not run as asked: another device, or another precision."""
    return bool(report.fallbacks or report.precision_note)
