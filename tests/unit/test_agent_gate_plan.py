"""Which engines and devices the agent's health gate vets a new version on.

The engines are real in `tests/integration/test_agent_gate_engines.py`; here the plan
alone, since a compile that ran on a GPU needs a GPU this machine lacks: its report is
made by hand.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from edge_agent.agent.models import ModelOps
from edge_agent.pipelines.spec import ModelRef
from edge_agent.runtime.base import CompileReport


def _report(requested: str, device: str, backend: str = "openvino") -> CompileReport:
    return CompileReport(
        backend=backend,
        requested=requested,
        device=device,
        precision="f32",
        hint="throughput",
        requests=2,
        compile_s=0.1,
        from_cache=False,
        inputs={},
    )


def _ops(tmp_path: Path, refs: list[ModelRef], serving: list[CompileReport]) -> ModelOps:
    pipelines: Any = SimpleNamespace(
        refs_of=lambda name: [r for r in refs if r.name == name],
        pool=SimpleNamespace(compiles=lambda: {"orient": serving} if serving else {}),
    )
    layout: Any = SimpleNamespace(cache=tmp_path)
    none: Any = None
    return ModelOps(none, none, layout, pipelines, lambda *a: None, [], "box-1", device="CPU")


def _plan(ops: ModelOps, name: str = "orient") -> list[tuple[str, str | None]]:
    return [(g.backend, "any" if g.any_device else g.planned_device) for g in ops.gate(name).gates]


def test_a_version_must_run_where_the_serving_one_runs_even_under_a_priority_list(
    tmp_path: Path,
) -> None:
    ref = ModelRef(name="orient", device="GPU,CPU")
    # Served on the GPU now: a new version falling to the CPU would serve at a fraction of
    # the speed, so the GPU is what it must run on.
    assert _plan(_ops(tmp_path, [ref], [_report("GPU,CPU", "GPU")])) == [("openvino", "GPU")]
    # Served on the CPU of a box without a GPU: a new version doing the same is no worse.
    assert _plan(_ops(tmp_path, [ref], [_report("GPU,CPU", "CPU")])) == [("openvino", "CPU")]
    # Nothing serving (a pipeline failed, or waits to retry): nothing to be worse than.
    assert _plan(_ops(tmp_path, [ref], [])) == [("openvino", "any")]


def test_the_plan_is_the_devices_the_engine_named_not_the_request_as_typed(
    tmp_path: Path,
) -> None:
    # Planned as typed, "gpu>cpu", AUTO, or a GPU asked of ONNX Runtime (whose wheel has
    # the CPU alone) never matched the device that ran, and every new version failed.
    for request, backend in (("gpu>cpu", "openvino"), ("AUTO", "openvino"), ("GPU", "onnxruntime")):
        ref = ModelRef(name="orient", device=request, backend=backend)
        serving = [_report(request, "CPU", backend)]
        assert _plan(_ops(tmp_path, [ref], serving)) == [(backend, "CPU")], request


def test_one_gate_per_engine_and_device_and_the_default_when_no_pipeline_runs_it(
    tmp_path: Path,
) -> None:
    refs = [
        ModelRef(name="orient", device="CPU"),
        ModelRef(name="orient", device="CPU"),
        ModelRef(name="orient", device="CPU", backend="onnxruntime"),
        ModelRef(name="other", device="GPU"),
    ]
    ops = _ops(tmp_path, refs, [])
    assert _plan(ops) == [("onnxruntime", "any"), ("openvino", "any")]
    assert _plan(ops, "idle") == [("openvino", "any")]
