"""The supervisor: between the protocol and the core.

It owns the agent's pipelines and model operations and answers each command
type with one short call. No MQTT here (the service wires it to the broker)
and no command parsing (the dispatcher validated the arguments), so it is
tested without a broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from edge_agent import __version__
from edge_agent.agent.jobs import JobContext
from edge_agent.agent.models import ModelOps
from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.records import AgentRecords
from edge_agent.build_id import build_id
from edge_agent.errors import EdgeAgentError, from_os_error
from edge_agent.protocol import agent as msg


class AgentSupervisor:
    """Carries out validated commands.

    Args:
        pipelines: The running pipelines.
        models: Model operations.
        records: Persistent agent settings.
        telemetry_interval: Reads the interval in force; `set_telemetry` changes the record.
    """

    def __init__(
        self,
        pipelines: Pipelines,
        models: ModelOps,
        records: AgentRecords,
        on_telemetry_interval: Callable[[float], None],
        status_extra: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.pipelines = pipelines
        self.models = models
        self.records = records
        self._on_interval = on_telemetry_interval
        self._status_extra = status_extra or dict
        self.started = time.monotonic()  # uptime is a duration: immune to clock steps

    def run_command(self, kind: str, args: BaseModel, job: JobContext) -> dict[str, Any]:
        """One validated command; its result dict, or EdgeAgentError."""
        handler = getattr(self, f"_cmd_{kind}", None)
        if handler is None:  # COMMAND_ARGS and this class disagree: a bug, said clearly
            raise EdgeAgentError(f"{kind} is not implemented by this agent", code="internal")
        result: dict[str, Any] = handler(args, job)
        return result

    # --- commands: one short call each ------------------------------------------------------
    def _cmd_ping(self, args: msg.NoArgs, job: JobContext) -> dict[str, Any]:
        return {"pong": True, "ts": time.time()}

    def _cmd_get_status(self, args: msg.NoArgs, job: JobContext) -> dict[str, Any]:
        return self.status()

    def _cmd_doctor(self, args: msg.NoArgs, job: JobContext) -> dict[str, Any]:
        from edge_agent.doctor import collect  # imports every engine: only when asked

        return collect(self.models.layout).model_dump(mode="json")

    def _cmd_list_models(self, args: msg.NoArgs, job: JobContext) -> dict[str, Any]:
        return self.models.listing()

    def _cmd_deploy_model(self, args: msg.DeployModelArgs, job: JobContext) -> dict[str, Any]:
        result: dict[str, Any] = self.models.deploy(args.name, args.version, args.activate, job)
        return result

    def _cmd_activate_model(self, args: msg.ActivateModelArgs, job: JobContext) -> dict[str, Any]:
        return self.models.activate(args.name, args.version, job)

    def _cmd_rollback_model(self, args: msg.ModelNameArgs, job: JobContext) -> dict[str, Any]:
        return self.models.rollback(args.name)

    def _cmd_remove_model(self, args: msg.RemoveModelArgs, job: JobContext) -> dict[str, Any]:
        return self.models.remove(args.name, args.version)

    def _cmd_start_pipeline(self, args: msg.StartPipelineArgs, job: JobContext) -> dict[str, Any]:
        return self.pipelines.start(args.spec).model_dump(mode="json")

    def _cmd_stop_pipeline(self, args: msg.PipelineIdArgs, job: JobContext) -> dict[str, Any]:
        return self.pipelines.stop(args.id).model_dump(mode="json")

    def _cmd_list_pipelines(self, args: msg.NoArgs, job: JobContext) -> dict[str, Any]:
        return {"pipelines": [p.model_dump(mode="json") for p in self.pipelines.states()]}

    def _cmd_swap_model(self, args: msg.SwapModelArgs, job: JobContext) -> dict[str, Any]:
        return self.pipelines.swap(args.id, args.model).model_dump(mode="json")

    def _cmd_calibrate(self, args: msg.CalibrateArgs, job: JobContext) -> dict[str, Any]:
        return self.models.calibrate(args.model, args.data, args.device, args.install_as, job)

    def _cmd_set_telemetry(self, args: msg.SetTelemetryArgs, job: JobContext) -> dict[str, Any]:
        # In force first, kept second: written first, a full state disk kept the old
        # interval too, though nothing about sending telemetry needs that disk.
        self._on_interval(args.interval_s)
        try:
            self.records.update(telemetry_interval_s=args.interval_s)
        except OSError as exc:
            cause = from_os_error(exc)
            raise EdgeAgentError(
                f"the telemetry interval is {args.interval_s:g} s from now on, but it could "
                f"not be kept for after a restart: {cause.problem}",
                f"{cause.fix}; send set_telemetry again to keep it",
                code=cause.code,
            ) from exc
        return {"interval_s": args.interval_s}

    # --- reading ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Versions, models, pipelines and the service's own figures."""
        return {
            "agent_version": __version__,
            "agent_build": build_id(),
            "uptime_s": round(time.monotonic() - self.started, 3),
            "models": [m.model_dump(mode="json") for m in self.models.states()],
            "pipelines": [p.model_dump(mode="json") for p in self.pipelines.states()],
            **self._status_extra(),
        }
