"""`calibrate(model, data, recipe) -> (model, report)`: compress, gate, fall back.

The gate compares the compressed model's decoded answers on held-out samples
with the FP32 model's (see tasks). A rung whose drop exceeds `max_drop` is
never activated; the ladder then tries safer rungs by itself:
int8 -> int8 with the first and last layers kept in float -> int8 with NNCF's
accuracy control -> weights-only INT8 -> the uncompressed model at the device's
default precision (bf16 or f16) -> FP32. The report says which rung won and why,
so an operator never ships a model that quietly lost its accuracy.

Each rung is scored as it will serve: on the device it will run on, at the
precision the written manifest leaves it (the device default, or f32 pinned
when only FP32 passed). A bf16 CPU runs an INT8 model's float layers at bf16,
so a gate at f32 would judge a model other than the one that runs.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nncf
import openvino as ov
from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.manifest import ImageInput
from edge_agent.errors import EdgeAgentError
from edge_agent.quantize.data import refuse_calibrated
from edge_agent.quantize.recipe import CalibrationReport, Precision, Recipe, Rung, RungResult
from edge_agent.quantize.tasks import (
    Inputs,
    Outputs,
    Sample,
    Task,
    build_task,
    check_metric,
    non_finite,
)
from edge_agent.runtime.devices import is_present, parse_request

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]
"""(stage, fraction done of that stage); for a progress bar or an MQTT progress response."""

_QUANTIZABLE = {"Convolution", "GroupConvolution", "MatMul", "ConvolutionBackpropData"}


@dataclass(frozen=True, slots=True)
class CalibrationData:
    """Samples as the model takes them: BGR frames fitted to its input (`load_frames`), or
    mono clips at its rate."""

    frames: list[Any]
    clips: list[Any]

    @property
    def count(self) -> int:
        return len(self.frames) or len(self.clips)


def read_fp32(core: ov.Core, resolved: ResolvedModel) -> ov.Model:
    """The model as the runtime would run it, before preprocessing is folded in."""
    model = core.read_model(str(resolved.path))
    spec = resolved.manifest.input
    if isinstance(spec, ImageInput):
        model.reshape({spec.name: ov.PartialShape(list(spec.shape))})
    return model


def _runner(compiled: Any) -> Callable[[Inputs], Outputs]:
    request = compiled.create_infer_request()
    names = [(i, sorted(o.get_names())) for i, o in enumerate(compiled.outputs)]

    def run(inputs: Inputs) -> Outputs:
        request.infer(inputs)
        found: Outputs = {}
        for index, keys in names:
            data = request.get_output_tensor(index).data.copy()
            for key in keys:
                found[key] = data
        return found

    return run


def _first_and_last_layers(model: ov.Model) -> list[str]:
    layers = [
        op.get_friendly_name()
        for op in model.get_ordered_ops()
        if op.get_type_name() in _QUANTIZABLE
    ]
    return list(dict.fromkeys([layers[0], layers[-1]])) if layers else []


def _ignored(recipe: Recipe, extra: list[str]) -> nncf.IgnoredScope | None:
    scope = recipe.ignored_scope
    if scope is None and not extra:
        return None
    return nncf.IgnoredScope(
        patterns=list(scope.patterns) if scope else [],
        names=(list(scope.names) if scope else []) + extra,
        types=list(scope.types) if scope else [],
        validate=False,  # a pattern that matches nothing in this model is not an error
    )


def ladder(mode: str, default_precision: str | None = None) -> list[Rung]:
    """The rungs to try, from the recipe's mode down to FP32.

    Args:
        mode: the recipe's first rung.
        default_precision: the device's default inference precision; bf16 or f16 adds
            the uncompressed model at that precision as the rung before FP32.
    """
    compressed: list[Rung]
    if mode == "weights-int4":
        compressed = ["weights-int4", "weights-int8"]
    elif mode == "weights-int8":
        compressed = ["weights-int8"]
    elif mode == "int8-accuracy":
        compressed = ["int8-accuracy", "weights-int8"]
    else:
        compressed = ["int8", "int8-scope", "int8-accuracy", "weights-int8"]
    default: list[Rung] = []
    if default_precision == "bf16":
        default = ["bf16"]
    elif default_precision == "f16":
        default = ["f16"]
    return [*compressed, *default, "fp32"]


def serving_device(core: ov.Core, request: str) -> str:
    """The device the runtime will pick for `request`: its first present candidate."""
    available = list(core.available_devices)
    for candidate in parse_request(request):
        if is_present(candidate, available):
            return candidate
    raise EdgeAgentError(
        f"no device in {request!r} is present to calibrate for",
        "run `edge-agent doctor` to see which devices this box has",
        code="device.unavailable",
    )


def precheck(resolved: ResolvedModel, recipe: Recipe, device: str) -> None:
    """Refuse what `Calibrator` would refuse of the request before the data is read.

    Reading a capture takes minutes; a wrong --device or a recipe metric that does not
    fit the model's head is known without it.

    Raises:
        EdgeAgentError: calibration.unsupported for a calibrated model, config.invalid for
            the metric, device.unavailable when no device in `device` is present.
    """
    refuse_calibrated(resolved)
    check_metric(resolved.manifest, recipe.metric)
    serving_device(ov.Core(), device)


def _precision_of(compiled: Any) -> str:
    """The precision a compiled model really runs at ('?' when the device does not say)."""
    try:
        return str(compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())
    except (RuntimeError, AttributeError):  # virtual devices may not answer
        return "?"


def _default_precision(core: ov.Core, device: str) -> str:
    """The precision `device` runs a model at when none is asked for ('?' if it does not say)."""
    try:
        return str(core.get_property(device, "INFERENCE_PRECISION_HINT").get_type_name())
    except (RuntimeError, AttributeError):  # virtual devices may not answer
        return "?"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the ladder chose."""

    model: ov.Model
    rung: Rung
    reason: str
    rungs: list[RungResult]
    precision: str
    """The precision the gate scored the winner at (what it serves at)."""
    pinned: Precision | None
    """The precision to write into the manifest; None keeps the device default."""


@contextlib.contextmanager
def quiet_nncf() -> Iterator[None]:
    # NNCF logs every ignored node at INFO; the operator needs its progress bars, not those.
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


class Calibrator:
    """One calibration run: the FP32 reference, then the rungs."""

    def __init__(
        self, resolved: ResolvedModel, data: CalibrationData, recipe: Recipe, device: str,
        progress: Progress | None = None,
    ) -> None:  # fmt: skip
        refuse_calibrated(resolved)
        self.resolved = resolved
        self.recipe = recipe
        self.progress = progress or (lambda stage, done: None)
        self._at = 0.0
        """How far the walk is: the fraction `compress` reports while NNCF reads samples."""
        self.core = ov.Core()
        self.device = serving_device(self.core, device)
        self.fp32 = read_fp32(self.core, resolved)
        # The reference is FP32 as exactly as this box can compute it: CPU at f32.
        compiled = self.core.compile_model(self.fp32, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        self.default_precision = _default_precision(self.core, self.device)
        shapes = {
            i.get_any_name(): tuple(d.get_length() for d in i.get_partial_shape())
            for i in self.fp32.inputs
            if i.get_partial_shape().is_static
        }
        self.progress("preparing samples", 0.0)
        self.task: Task = build_task(
            resolved.manifest, data.frames, data.clips, recipe.holdout, recipe.metric,
            _runner(compiled), shapes,
        )  # fmt: skip
        self.progress("reference (fp32)", 0.0)
        self.reference = self.task.run(_runner(compiled), self.task.holdout)
        self.task.require_evidence(self.reference)
        self.samples = min(
            recipe.subset_size or len(self.task.calibration), len(self.task.calibration)
        )

    def evaluate(self, model: ov.Model, precision: Precision | None) -> tuple[float, str, int]:
        """Score `model` as it will serve: on the serving device, at `precision` (None:
        the device default). Returns the score, the precision the device really used and
        how many held-out items it answered with NaN or inf (each fails the rung)."""
        config = {} if precision is None else {"INFERENCE_PRECISION_HINT": precision}
        compiled = self.core.compile_model(model, self.device, config)
        outputs = self.task.run(_runner(compiled), self.task.holdout)
        broken = non_finite(self.reference, outputs)
        # A NaN or inf scores 0 (`per_item` would find them again to say so).
        score = 0.0 if broken else self.task.score(self.reference, outputs)
        return score, _precision_of(compiled), broken

    def compress(self, rung: Rung) -> ov.Model:
        r = self.recipe
        # NNCF's weight compression rewrites the model it is given in place: without a
        # copy, every later rung (and the FP32 output itself) would be compressed too.
        fp32 = self.fp32.clone()
        stage = f"rung {rung}"
        at = self._at

        def feed(sample: Sample) -> Inputs:
            # Said again for every sample NNCF reads: a cancel, or the agent's job deadline,
            # is heard between samples instead of after a rung that can take minutes.
            self.progress(stage, at)
            return self.task.feed(sample)

        calibration = nncf.Dataset(self.task.calibration, feed)
        preset = nncf.QuantizationPreset(r.preset)
        common: dict[str, Any] = {
            "preset": preset,
            "subset_size": self.samples,
            "fast_bias_correction": r.fast_bias_correction,
        }
        if rung == "int8":
            return nncf.quantize(fp32, calibration, ignored_scope=_ignored(r, []), **common)
        if rung == "int8-scope":
            extra = _first_and_last_layers(fp32)
            return nncf.quantize(fp32, calibration, ignored_scope=_ignored(r, extra), **common)
        if rung == "int8-accuracy":
            if self.task.state_shape is not None:
                raise _SkipError(
                    "accuracy control scores windows one by one; a stateful model needs a sequence"
                )
            # NNCF restores layers until its validation set passes max_drop: on the gate's
            # held-out set, the gate judged the very samples the model was tuned to pass.
            # It tunes on the calibration samples; the held-out set stays unseen.
            tuning = self.task.calibration[: self.samples]
            items = list(enumerate(tuning))
            self.progress(stage, at)
            compiled_fp32 = self.core.compile_model(
                fp32, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
            )
            reference = self.task.run(_runner(compiled_fp32), tuning)
            del compiled_fp32

            def validate(
                compiled: Any, batch: Iterable[tuple[int, Sample]]
            ) -> tuple[float, list[float]]:
                chosen = list(batch)
                run = _runner(compiled)
                # Each item scored alone against FP32's answer; NNCF ranks layers by these.
                outputs = [run(feed(sample)) for _, sample in chosen]
                refs = [reference[i] for i, _ in chosen]
                return self.task.per_item(refs, outputs)

            return nncf.quantize_with_accuracy_control(
                fp32, calibration, nncf.Dataset(items, lambda item: feed(item[1])), validate,
                max_drop=r.max_drop, drop_type=nncf.DropType.ABSOLUTE,
                ignored_scope=_ignored(r, []), **common,
                advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                    max_num_iterations=r.accuracy_iterations
                ),
            )  # fmt: skip
        if rung == "weights-int8":
            return nncf.compress_weights(fp32, mode=nncf.CompressWeightsMode.INT8_ASYM)
        # all_layers: small vision and audio models have no embedding to spare; compress all.
        return nncf.compress_weights(fp32, mode=nncf.CompressWeightsMode.INT4_ASYM, all_layers=True)

    def walk(self) -> Outcome:
        full = ladder(self.recipe.mode, self.default_precision)
        rungs = full if self.recipe.ladder else [full[0], "fp32"]
        rungs = [r for r in rungs if r not in self.recipe.skip]
        results: list[RungResult] = []
        for index, rung in enumerate(rungs[:-1]):
            self._at = index / len(rungs)
            self.progress(f"rung {rung}", self._at)
            started = time.perf_counter()
            try:
                model, result = self._try(rung, started)
            except _SkipError as skip:
                results.append(_failed(rung, f"skipped: {skip}", 0.0))
                continue
            except EdgeAgentError:
                raise  # a cancelled job, or the operator's to fix: the whole run stops
            except Exception as exc:
                # NNCF raises kinds of its own beyond its documented ones (weights-int4 on a
                # layer 96 wide: InvalidGroupSizeError), and a GPU or NPU plugin may refuse
                # to compile or run a compressed graph: each used to end the whole run, with
                # a traceback, instead of stepping down to a safer rung.
                log.debug(
                    "event=calibrate_rung_failed model=%s rung=%s", self.resolved.manifest.name,
                    rung, exc_info=True,
                )  # fmt: skip
                reason = f"failed: {type(exc).__name__}: {first_line(exc)}"
                results.append(_failed(rung, reason, time.perf_counter() - started))
                continue
            results.append(result)
            if result.passed:
                return Outcome(model, rung, result.reason, results, result.precision, None)
        # FP32 is the floor: it ships whatever it scores, pinned to f32 so the runtime does
        # not quietly run it at a default precision the gate has just rejected.
        self.progress("rung fp32", (len(rungs) - 1) / len(rungs))
        why = "FP32 asked for" if not results else "no faster rung passed the gate; FP32 kept"
        try:
            result = self._judge("fp32", self.fp32, "f32", time.perf_counter(), floor=why)
        except EdgeAgentError:
            raise
        except Exception as exc:
            # The floor failing leaves nothing to ship: the run fails, as one line.
            raise EdgeAgentError(
                f"{self.resolved.manifest.name} at f32 fails on {self.device}: "
                f"{type(exc).__name__}: {first_line(exc)}",
                "run `edge-agent doctor` to check the device, or calibrate for another --device",
                "calibration.failed",
            ) from exc
        results.append(result)
        return Outcome(self.fp32, "fp32", result.reason, results, result.precision, "f32")

    def _try(self, rung: Rung, started: float) -> tuple[ov.Model, RungResult]:
        """Make one rung's model and gate it; raises whatever failed on the way."""
        if rung in ("bf16", "f16"):
            model = self.fp32  # no compression: FP32 weights at the device's default
        else:
            with quiet_nncf():
                model = self.compress(rung)
        return model, self._judge(rung, model, None, started)

    def _judge(
        self, rung: Rung, model: ov.Model, precision: Precision | None, started: float,
        floor: str = "",
    ) -> RungResult:  # fmt: skip
        score, used, broken = self.evaluate(model, precision)
        drop = 1.0 - score
        passed = bool(floor) or drop <= self.recipe.max_drop + 1e-9
        verdict = "within" if drop <= self.recipe.max_drop + 1e-9 else "exceeds"
        reason = (
            f"{self.task.metric} {score:.4f} at {used} on {self.device}: drop {drop:.4f} "
            f"{verdict} max_drop {self.recipe.max_drop}"
        )
        if broken:
            reason += f" (NaN or inf in {broken} of {len(self.reference)} held-out outputs)"
        if floor:
            reason = f"{floor} at f32 ({reason})"
        log.info(
            "event=calibrate_rung model=%s rung=%s precision=%s metric=%.4f passed=%s",
            self.resolved.manifest.name, rung, used, score, passed,
        )  # fmt: skip
        return RungResult(
            rung=rung,
            precision=used,
            metric_after=score,
            drop=drop,
            passed=passed,
            reason=reason,
            seconds=time.perf_counter() - started,
        )


def first_line(exc: BaseException) -> str:
    """An exception's first line, at most 200 characters: NNCF's and OpenVINO's run long."""
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _failed(rung: Rung, reason: str, seconds: float) -> RungResult:
    """A rung that produced no model to gate: skipped, or NNCF could not do it."""
    return RungResult(
        rung=rung, precision="", metric_after=0.0, drop=1.0, passed=False, reason=reason,
        seconds=seconds,
    )  # fmt: skip


class _SkipError(Exception):
    """A rung that does not apply to this model."""


def save_ir(model: ov.Model, folder: Path, name: str = "model") -> Path:
    """Write an IR pair; the .xml last, so its presence says the pair is complete."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".save-") as tmp:
        staged = Path(tmp) / f"{name}.xml"
        ov.save_model(model, str(staged), compress_to_fp16=False)
        target = folder / f"{name}.xml"
        staged.with_suffix(".bin").replace(target.with_suffix(".bin"))
        staged.replace(target)
    return target


def versions() -> dict[str, str]:
    return {"openvino": ov.get_version(), "nncf": nncf.__version__}


__all__ = [
    "CalibrationData",
    "CalibrationReport",
    "Calibrator",
    "Outcome",
    "ladder",
    "precheck",
    "save_ir",
    "serving_device",
    "versions",
]
