"""Telemetry figures as the protocol carries them: per pipeline and per model.

Pure shaping of what the pipelines measured over one interval: milliseconds
rounded to microseconds, stages that saw no sample left out, and each model's
latency read off the busiest pipeline that runs it, with the engine, device and
precision that pipeline's compile of it really runs at (not another pipeline's
compile of the same model on another device).
"""

from __future__ import annotations

from edge_agent.protocol import agent as msg
from edge_agent.runtime.base import CompileReport
from edge_agent.telemetry.stats import PipelineStats


def pipeline_telemetry(stats: PipelineStats) -> msg.PipelineTelemetry:
    """One pipeline's interval figures."""
    return msg.PipelineTelemetry(
        fps=round(stats.fps, 3),
        frames=stats.frames,
        dropped_frames=stats.dropped,
        sink_failures=getattr(stats, "sink_failures", 0),
        stages={
            name: msg.StageTelemetry(
                count=s.count,
                p50_ms=round(s.p50_ms, 3),
                p95_ms=round(s.p95_ms, 3),
                p99_ms=round(s.p99_ms, 3),
                max_ms=round(s.max_ms, 3),
            )
            for name, s in stats.stages.items()
            if s.count
        },
    )


def model_telemetry(
    stats: dict[str, PipelineStats], models: dict[str, str], reports: dict[str, CompileReport]
) -> dict[str, msg.ModelTelemetry]:
    """Per model name; `models` maps pipeline id to the model serving it, `reports`
    pipeline id to that model's compile report."""
    # A model's latency is read off the pipelines that run it: the busiest speaks for it.
    found: dict[str, msg.ModelTelemetry] = {}
    for pipeline, snapshot in stats.items():
        infer = snapshot.stages.get("infer")
        name = models.get(pipeline)
        report = reports.get(pipeline)
        if infer is None or name is None or report is None or not infer.count:
            continue
        if name not in found or found[name].inferences < infer.count:
            found[name] = msg.ModelTelemetry(
                device=report.device,
                precision=report.precision,
                backend=report.backend,
                infer_p50_ms=round(infer.p50_ms, 3),
                infer_p95_ms=round(infer.p95_ms, 3),
                infer_p99_ms=round(infer.p99_ms, 3),
                inferences=infer.count,
            )
    return found
