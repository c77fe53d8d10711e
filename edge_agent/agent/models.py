"""Model commands: deploy, activate, roll back, remove, list, calibrate.

Thin on purpose: the store owns what is on disk and which version is active,
delivery owns the transfer, the health gate owns "is it healthy here". This
module sequences them for a command, reports progress, and tells the running
pipelines to pick up the new version (a hot swap between two frames).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge_agent.agent.jobs import JobContext
from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.sink import EmitEvent
from edge_agent.catalog.catalog import Catalog
from edge_agent.comms.base import Communicator
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import Throttle, log_event
from edge_agent.paths import Layout
from edge_agent.pipelines.confine import refuse_protected_path
from edge_agent.pipelines.spec import ModelRef
from edge_agent.protocol.agent import AgentEvent, ModelState
from edge_agent.protocol.topics import Topics
from edge_agent.quiet import stdout_to_stderr
from edge_agent.runtime.base import CompileReport, RuntimeOptions
from edge_agent.store.health import HealthGate, HealthGateError, HealthGates
from edge_agent.store.store import ModelStore

log = logging.getLogger(__name__)
SCRATCH_PREFIX = "calibrate-"
"""A calibration's scratch folder in `Layout.state_tmp`, the one thing the agent keeps there."""
_DAMAGED_SAY_EVERY_S = 3600.0
"""How often one damaged store entry is logged while it stays damaged."""


class ModelOps:
    """What the model commands do.

    Args:
        store: The model store.
        catalog: Store first, then reference models.
        layout: Cache and state folders.
        pipelines: Told to reload a model that changed.
        emit_event: Queues events.
        trusted_keys: Keys releases must be signed by; empty runs unverified.
        device: The device the health gate plans a model on when no pipeline runs it.
    """

    def __init__(
        self,
        store: ModelStore,
        catalog: Catalog,
        layout: Layout,
        pipelines: Pipelines,
        emit_event: EmitEvent,
        trusted_keys: Sequence[Ed25519PublicKey],
        device_id: str,
        device: str = "CPU",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.layout = layout
        self.pipelines = pipelines
        self._emit_event = emit_event
        self.trusted_keys = list(trusted_keys)
        self.device_id = device_id
        self.device = device
        self._clock = clock
        self.comm: Communicator | None = None
        self.topics = Topics()
        self._damaged_said = Throttle(_DAMAGED_SAY_EVERY_S)  # per damaged entry

    def gate(self, name: str) -> HealthGates:
        """The health gate for a new version of `name` on this box: compile, smoke-run and
        budget on each engine and device the pipelines on `name` run it on, or on the
        agent's default engine and device when none does.

        Gated on OpenVINO alone, a version ONNX Runtime cannot load (an IR, an opset too
        new) was activated, and every ONNX Runtime pipeline on it failed its swap. The
        cost stays bounded: one child probe per distinct (engine, device), not one per
        pipeline, so ten cameras on one model and device cost one probe.
        """
        runs = {(ref.backend, ref.device) for ref in self.pipelines.refs_of(name)}
        if not runs:
            runs = {(ModelRef.model_fields["backend"].default, self.device)}
        compiles = self.pipelines.pool.compiles().get(name, [])
        return HealthGates(tuple(self._gate_on(compiles, b, d) for b, d in sorted(runs)))

    def _gate_on(self, compiles: list[CompileReport], backend: str, device: str) -> HealthGate:
        options = RuntimeOptions(device=device, cache_dir=self.layout.cache)
        # Planned: the devices the version serving now runs on, as the engine named them.
        # A pipeline asking for a GPU the box lacks runs on its CPU, and a new version
        # doing the same is no worse; one that falls off a GPU the old version ran on is
        # worse, even where the pipeline asked for GPU,CPU: it would serve at a fraction of
        # the speed, on the CPU its other work needs. With none serving (a pipeline failed,
        # or waiting to retry) there is nothing to be worse than: any device will do, as
        # the pipeline's own compile takes it. The request as typed was no plan: "gpu>cpu",
        # AUTO, or ONNX Runtime (whose wheel has the CPU alone) never matched what ran.
        serving = [
            d
            for r in compiles
            if (r.backend, r.requested) == (backend, device)
            for d in r.device.split(",")
        ]
        if not serving:
            return HealthGate(options, backend=backend, any_device=True)
        planned = ",".join(dict.fromkeys(serving))
        return HealthGate(options, backend=backend, planned_device=planned)

    # --- commands ------------------------------------------------------------------------------
    def deploy(self, name: str, version: int | None, activate: bool, job: JobContext) -> Any:
        from edge_agent.delivery.pull import pull  # the delivery stack loads only when used

        if self.comm is None:
            raise EdgeAgentError("not connected to the broker", code="broker.unreachable")
        try:
            result = pull(
                self.comm,
                self.store,
                self.layout,
                name,
                device_id=self.device_id,
                version=version,
                trusted_keys=self.trusted_keys,
                topics=self.topics,
                activate=activate,
                gate=self.gate(name),
                progress=job.progress,
                cancel=job.cancel_event,
                commit=job.commit,
            )
        except EdgeAgentError as exc:
            if exc.code == "health.failed":
                # The version the gate failed: a deploy of `latest` (version None) had the
                # event say which only in its detail text.
                failed = exc.version if isinstance(exc, HealthGateError) else version
                self._event("model_health_failed", name, failed, exc.code, str(exc))
            raise
        swapped: list[str] = []
        if result.activated:
            self._event("model_activated", name, result.release.version)
            swapped = self.pipelines.reload_model(name)
        return {
            "name": name,
            "version": result.release.version,
            "installed": result.installed,
            "activated": result.activated,
            "chunks": result.chunks,
            "pipelines_swapped": swapped,
        }

    def activate(self, name: str, version: int, job: JobContext) -> dict[str, Any]:
        job.commit()  # queued behind a deploy, it may have been cancelled while it waited
        try:
            release = self.store.activate(name, version, self.gate(name))
        except EdgeAgentError as exc:
            if exc.code == "health.failed":
                self._event("model_health_failed", name, version, exc.code, str(exc))
            raise
        self._event("model_activated", name, release.version)
        return {
            "name": name,
            "version": version,
            "pipelines_swapped": self.pipelines.reload_model(name),
        }

    def rollback(self, name: str) -> dict[str, Any]:
        version = self.store.rollback(name)
        self._event("model_rolled_back", name, version)
        return {
            "name": name,
            "version": version,
            "pipelines_swapped": self.pipelines.reload_model(name),
        }

    def remove(self, name: str, version: int) -> dict[str, Any]:
        self.store.remove(name, version)
        return {"name": name, "version": version, "removed": True}

    def states(self) -> list[ModelState]:
        """Installed versions (current ones), then the reference models; those loaded say
        the device they run on, the precision used and any device fallback."""
        loaded = self.pipelines.pool.compiles()
        found = []
        entries, damaged = self.store.readable_entries()
        for problem in damaged:
            # Said once an hour per problem: the state goes out at every event, and a file
            # that stays damaged must not fill the journal.
            if not self._damaged_said.ready((problem.where, problem.what)):
                continue
            # The rest of the state still goes out: `list_models` and `verify` name it too.
            log_event(
                log,
                logging.ERROR,
                "store_damaged",
                where=problem.where,
                problem=problem.what,
                fix="run `edge-agent models verify` on the box; move a damaged state.json "
                "away (the model then has no active version) and activate or deploy it again",
            )
        for entry in entries:
            if entry.current:
                found += _states(entry.name, entry.version, entry.digest, loaded.get(entry.name))
        named = {m.name for m in found}
        for name in self.catalog.names():
            if name in named:
                continue
            manifest = self.catalog.manifest(name)
            digest = manifest.source.sha256 if manifest.source is not None else ""
            found += _states(name, None, digest, loaded.get(name))
        named |= {m.name for m in found}
        # Models run by path (a file with its manifest) are neither stored nor reference.
        for name, reports in loaded.items():
            if name not in named:
                found += _states(name, None, "", reports)
        return found

    def listing(self) -> dict[str, Any]:
        # One damaged file answered the whole listing store.corrupt, every other model
        # hidden from the operator sent to look; it is named beside them instead.
        entries, damaged = self.store.readable_entries()
        versions = [
            {
                "name": e.name,
                "version": e.version,
                "digest": e.digest,
                "current": e.current,
                "previous": e.previous,
            }
            for e in entries
        ]
        listing: dict[str, Any] = {"installed": versions, "reference": self.catalog.names()}
        if damaged:
            listing["damaged"] = [str(p) for p in damaged]
        return listing

    def calibrate(
        self, model: str, data: str, device: str, install_as: str | None, job: JobContext
    ) -> dict[str, Any]:
        """Calibrate on this box's data; the result is installed (not activated) in the store.

        The store takes it unsigned: these bytes were made here, not received.
        """
        from edge_agent.catalog.manifest import load_manifest
        from edge_agent.quantize.api import calibrate  # NNCF loads only when used
        from edge_agent.quantize.calibrate import precheck
        from edge_agent.quantize.data import (
            calibration_data,
            recipe_for,
            resolve_data,
        )
        from edge_agent.store.release import SignedRelease, build_release, weights_precision

        if not data.startswith("pipeline:"):  # a pipeline's captures, in the state: no path
            # As a pipeline's source is, before anything is looked up: a command must not
            # have the agent read its own secrets (the MQTT password file, TLS keys).
            refuse_protected_path(
                Path(data),
                self.pipelines.protected,
                code="command.invalid",
                field="args.data",
                fix="pass a folder of images, videos or WAVs, or pipeline:<id> for what a "
                "pipeline's capture sink kept",
            )
        resolved = self.catalog.resolve(model)
        recipe = recipe_for(resolved.manifest)
        precheck(resolved, recipe, device)  # before its data is read: minutes, for a refusal
        job.progress("data", 0.02)
        # The record as this agent holds it, not its file read again: on a state disk
        # that refused the last write, the file lags what the agent runs.
        source = resolve_data(data, self.layout, self.pipelines.records.record.pipelines.get)
        samples = calibration_data(source, resolved.manifest, recipe)
        job.check()
        name = install_as or f"{resolved.manifest.name}-int8"
        with tempfile.TemporaryDirectory(dir=self._scratch(), prefix=SCRATCH_PREFIX) as tmp:
            out = Path(tmp) / "out"

            def progress(stage: str, fraction: float) -> None:
                job.progress(stage, 0.05 + 0.85 * fraction)
                job.check()

            # NNCF draws progress bars on stdout; under systemd they would land in the
            # journal as carriage-return soup, and stdout is no channel of the agent's.
            with stdout_to_stderr():
                path, report = calibrate(resolved, samples, recipe, out, device, progress)
            job.check()
            version = self.store.state(name).highest + 1
            files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
            manifest = load_manifest(path.with_suffix(".toml"))
            release = build_release(
                name=name,
                version=version,
                folder=out,
                files=files,
                model=str(path.relative_to(out)),
                manifest=manifest,
                precision=weights_precision(manifest),
            )
            job.commit()
            self.store.install(SignedRelease(release=release), out, link=True)
        self._event("calibration_done", name, version, detail=report.mode)
        return {"name": name, "version": version, "report": report.model_dump(mode="json")}

    def sweep_scratch(self) -> None:
        """Delete what calibrations left in the state's scratch folder; call at agent start,
        before any command runs.

        A stop during a calibration (systemd stop, an upgrade, the OOM killer) skips its
        cleanup: the job runs on a daemon thread and the agent waits 5 s for it, so each
        interrupted run left its FP32 and INT8 IRs on the state disk for good. Only the
        calibrations' own folders go: nothing else of the agent writes here.
        """
        for leftover in self.layout.state_tmp.glob(f"{SCRATCH_PREFIX}*"):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)

    def _scratch(self) -> Path:
        folder = self.layout.state_tmp
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _event(
        self,
        kind: str,
        model: str,
        version: int | None,
        code: str | None = None,
        detail: str = "",
    ) -> None:
        self._emit_event(
            AgentEvent.model_validate(
                {
                    "kind": kind,
                    "ts": self._clock(),
                    "model": model,
                    "version": version,
                    "code": code,
                    "detail": detail,
                }
            )
        )


def _states(
    name: str, version: int | None, digest: str, reports: list[CompileReport] | None
) -> list[ModelState]:
    """One entry per distinct way the model runs (compiles that differ only in options the
    state does not show, a hint say, are one entry); one without device when not loaded."""
    if not reports:
        return [ModelState(name=name, version=version, digest=digest)]
    found: list[ModelState] = []
    for report in reports:
        fallback = "; ".join(f"{f.device}: {f.reason}" for f in report.fallbacks) or None
        state = ModelState(
            name=name,
            version=version,
            digest=digest,
            device=report.device,
            precision=report.precision,
            fallback=fallback,
            backend=report.backend,
        )
        if state not in found:
            found.append(state)
    return found
