"""The agent's command protocol: commands, answers, state, telemetry, results, events.

Every message is a strict pydantic model; docs/PROTOCOL.md's schemas are
exported from these (tools/export_schemas.py), so the document cannot drift
from the code. Pure: nothing here does I/O or knows of OpenVINO.

Times are Unix seconds (float) as the box's clock had them when the thing
happened, not when it was published: the outbox may hold a message for as long
as the broker is away.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_agent.paths import MODEL_NAME

SCHEMA_VERSION = 1
"""Bumped when a message changes incompatibly; telemetry carries it as `schema`."""

_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- fleet -> device ------------------------------------------------------------------------
COMMAND_TYPE_MAX = 64
"""The longest command type an envelope carries."""


class Command(_Strict):
    """A command envelope, on `<prefix>/<device>/cmd` or `<prefix>/group/<group>/cmd` (QoS 1)."""

    id: str = Field(
        pattern=_ID,
        description="Correlation and idempotency key: a command delivered twice runs once, "
        "and its stored answer is sent again.",
    )
    type: str = Field(
        min_length=1,
        max_length=COMMAND_TYPE_MAX,
        description="Command type, e.g. ping, deploy_model.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Arguments; each type's schema is below."
    )
    sent_at: float = Field(description="Unix seconds when the console sent it.")
    expires_at: float | None = Field(
        default=None, description="Unix seconds after which the device must not run it."
    )


class NoArgs(_Strict):
    """Arguments of commands that take none (ping, get_status, doctor, list_*)."""


class DeployModelArgs(_Strict):
    """deploy_model: pull a published release, verify it, install it, activate behind the gate."""

    name: str = Field(description="Model name as published.")
    version: int | None = Field(default=None, ge=1, description="Version; None: the newest.")
    activate: bool = Field(default=True, description="Activate behind the health gate.")


class ActivateModelArgs(_Strict):
    """activate_model: make an installed version current, behind the health gate."""

    name: str = Field(description="Model name.")
    version: int = Field(ge=1, description="Installed version to activate.")


class ModelNameArgs(_Strict):
    """rollback_model: bring back the previous version."""

    name: str = Field(description="Model name.")


class RemoveModelArgs(_Strict):
    """remove_model: delete an installed version that is neither current nor previous."""

    name: str = Field(description="Model name.")
    version: int = Field(ge=1, description="Version to remove.")


class StartPipelineArgs(_Strict):
    """start_pipeline: run a pipeline; restored after a restart until stopped or finished."""

    spec: dict[str, Any] = Field(
        description="A PipelineSpec as JSON (see the README); its model names a store model "
        "or a reference model."
    )


class PipelineIdArgs(_Strict):
    """stop_pipeline: stop a running pipeline and forget it (or one recorded that did not start)."""

    id: str = Field(pattern=_ID, description="Pipeline id.")


class SwapModelArgs(_Strict):
    """swap_model: hot-swap the model of a running vision pipeline between two frames."""

    id: str = Field(pattern=_ID, description="Pipeline id.")
    model: dict[str, Any] = Field(description="A ModelRef as JSON: name, device, hint, ...")


class CalibrateArgs(_Strict):
    """calibrate: INT8 on data this box captured, gated on accuracy; installs the result."""

    model: str = Field(description="Model to calibrate (store or reference name).")
    data: str = Field(description="`pipeline:<id>` for a pipeline's capture, or a folder.")
    device: str = Field(default="CPU", description="Device the result will run on.")
    install_as: str | None = Field(
        default=None,
        pattern=MODEL_NAME,
        max_length=64,  # a folder's name in the store, with room for its suffixes
        description="Store name for the result; default <model>-int8.",
    )


class SetTelemetryArgs(_Strict):
    """set_telemetry: change the telemetry interval (and keep it across restarts)."""

    interval_s: float = Field(ge=1.0, le=3600.0, description="Seconds between telemetry.")


class CancelArgs(_Strict):
    """cancel: cancel a running long command by its id."""

    id: str = Field(pattern=_ID, description="Id of the command to cancel.")


COMMAND_ARGS: dict[str, type[BaseModel]] = {
    "ping": NoArgs,
    "get_status": NoArgs,
    "doctor": NoArgs,
    "list_models": NoArgs,
    "list_pipelines": NoArgs,
    "deploy_model": DeployModelArgs,
    "activate_model": ActivateModelArgs,
    "rollback_model": ModelNameArgs,
    "remove_model": RemoveModelArgs,
    "start_pipeline": StartPipelineArgs,
    "stop_pipeline": PipelineIdArgs,
    "swap_model": SwapModelArgs,
    "calibrate": CalibrateArgs,
    "set_telemetry": SetTelemetryArgs,
    "cancel": CancelArgs,
}
"""Every command type and its arguments; a type not here is answered command.unknown."""


def validate_args(kind: str, args: Any) -> BaseModel:
    """A command's arguments as the agent takes them, for the agent and its console alike.

    Strict: true is not version 1, nor "5" an interval of 5 s; a console that sends the
    wrong type has a bug the answer should show, not hide.

    Raises:
        KeyError: `kind` is not a command type.
        ValidationError: the arguments do not fit the type's model.
    """
    return COMMAND_ARGS[kind].model_validate(args, strict=True)


LONG_COMMANDS = frozenset({"deploy_model", "calibrate", "activate_model"})
"""Commands answered accepted -> progress* -> ok|error, and cancellable."""

MAX_QUEUED_JOBS = 16
"""Long commands waiting behind the running one; past it they are refused command.busy."""


# --- device -> fleet ------------------------------------------------------------------------
class ErrorBody(_Strict):
    """Why a command failed."""

    code: str = Field(description="Stable machine-readable code (see the code table).")
    message: str = Field(description="What went wrong and how to fix it, for a person.")
    field: str | None = Field(default=None, description="The argument that is wrong, if one is.")


class Progress(_Strict):
    """How far a long command has got."""

    stage: str = Field(description="Stage name, e.g. pull, verify, install, health, quantize.")
    fraction: float = Field(ge=0.0, le=1.0, description="0..1 within the whole command.")


class Response(_Strict):
    """An answer on `<prefix>/<device>/resp`: every command gets at least one."""

    id: str = Field(description="The command's id ('' when the envelope itself was unreadable).")
    status: Literal["accepted", "progress", "ok", "error"] = Field(description="Answer kind.")
    device_id: str = Field(description="Which device answers (group commands reach many).")
    ts: float = Field(description="Unix seconds when the answer was made.")
    progress: Progress | None = Field(default=None, description="With status progress.")
    result: dict[str, Any] | None = Field(default=None, description="With status ok.")
    error: ErrorBody | None = Field(default=None, description="With status error.")


class ModelState(_Strict):
    """A model the agent has loaded or installed: one entry per distinct compile of it.

    Two pipelines may run one model on different devices or engines (one fell back from
    its GPU, the other asked for the CPU): each compile gets its own entry, so one that
    fell back is never hidden behind another of the same name. A model installed but not
    loaded has one entry, without device.
    """

    name: str = Field(description="Model name.")
    version: int | None = Field(
        default=None, description="Store version; None (or absent) for a reference model."
    )
    digest: str = Field(description="sha256 of the model file.")
    device: str | None = Field(default=None, description="Device it runs on, if loaded.")
    precision: str | None = Field(default=None, description="Precision it runs at, if loaded.")
    fallback: str | None = Field(
        default=None, description="Why a requested device was passed over, if one was."
    )
    # A string, not a Literal: a console that meets an engine added after it must still
    # read the rest of the state (an unknown value would make the whole message unreadable).
    backend: str | None = Field(
        default=None,
        description="Engine it runs on, openvino or onnxruntime, if loaded (absent from "
        "agents before it).",
    )


class PipelineState(_Strict):
    """A pipeline the agent runs."""

    id: str = Field(description="Pipeline id.")
    model: str = Field(description="Model name it runs.")
    status: Literal["starting", "running", "failed", "stopped"] = Field(description="Status.")
    detail: str = Field(default="", description="Why it failed, when it did.")


class State(_Strict):
    """Retained on `<prefix>/<device>/state`: the birth message, and the will when offline.

    `seq` goes up with every connection (Sparkplug's bdSeq): the fleet ignores an
    offline will whose seq is older than the online message it has, so a stale will
    from a connection that died just before a fast restart cannot mark a live agent
    offline.
    """

    online: bool = Field(description="True while connected; the will says false.")
    seq: int = Field(ge=0, description="Connection sequence number, up by one per connect.")
    ts: float = Field(description="Unix seconds when the message was made.")
    agent_version: str | None = Field(default=None, description="edge-agent version.")
    agent_build: str | None = Field(
        default=None,
        description="Digest of the agent's source files: tells builds of one version apart "
        "(absent from agents before it).",
    )
    mqtt_version: str | None = Field(default=None, description="MQTT protocol in use: 5 or 3.1.1.")
    group: str | None = Field(
        default=None, description="Fleet group whose commands it takes (group/<group>/cmd)."
    )
    devices: list[str] = Field(default_factory=list, description="Inference devices on the box.")
    models: list[ModelState] = Field(default_factory=list, description="Models.")
    pipelines: list[PipelineState] = Field(default_factory=list, description="Pipelines.")
    config_hash: str | None = Field(default=None, description="Digest of the effective config.")
    unverified: bool = Field(default=False, description="True when no trusted keys are configured.")


class StageTelemetry(_Strict):
    """One stage's latency over the interval, in milliseconds."""

    count: int = Field(ge=0, description="Samples in the interval.")
    p50_ms: float = Field(description="Median.")
    p95_ms: float = Field(description="95th percentile.")
    p99_ms: float = Field(description="99th percentile.")
    max_ms: float = Field(description="Largest.")


class PipelineTelemetry(_Strict):
    """One pipeline over the interval."""

    fps: float = Field(ge=0.0, description="Frames per second over the interval.")
    frames: int = Field(ge=0, description="Frames finished in the interval.")
    dropped_frames: int = Field(ge=0, description="Frames dropped in the interval.")
    sink_failures: int = Field(default=0, ge=0, description="Sink failures in the interval.")
    calls_per_frame: float = Field(default=1.0, ge=0.0, description="Model calls per frame.")
    stages: dict[str, StageTelemetry] = Field(description="Latency per stage.")


class ModelTelemetry(_Strict):
    """One loaded model: where it runs, at what precision, and how fast."""

    device: str = Field(description="Device(s) executing it, as the engine reports them.")
    precision: str = Field(description="Inference precision really used, e.g. f32, bf16, int8.")
    backend: str | None = Field(
        default=None,
        description="Engine it runs on, openvino or onnxruntime (absent from agents before it).",
    )
    infer_p50_ms: float = Field(description="Median inference latency over the interval.")
    infer_p95_ms: float = Field(description="95th percentile inference latency.")
    infer_p99_ms: float = Field(description="99th percentile inference latency.")
    inferences: int = Field(ge=0, description="Inferences in the interval.")


class AgentTelemetry(_Strict):
    """The agent process and the box."""

    cpu_percent: float = Field(ge=0.0, description="Process CPU over the interval (100 = 1 core).")
    cpu_cores: float | None = Field(
        default=None,
        gt=0.0,
        description="CPUs the agent may use (its affinity, or its cgroup's CPU quota if "
        "lower): cpu_percent reaches 100 times this when it takes them all (absent from "
        "agents before it).",
    )
    rss_bytes: int = Field(ge=0, description="Resident memory.")
    temperature_c: float | None = Field(default=None, description="Hottest thermal zone, if any.")
    outbox_depth: int = Field(ge=0, description="Messages waiting in the outbox.")
    outbox_bytes: int = Field(ge=0, description="Bytes waiting in the outbox.")
    outbox_dropped: int = Field(ge=0, description="Messages the outbox dropped, ever.")
    reconnects: int = Field(
        ge=0, description="Links to the broker lost since start (failed connects are not counted)."
    )
    uptime_s: float = Field(ge=0.0, description="Seconds since the agent started.")


class Telemetry(_Strict):
    """On `<prefix>/<device>/telemetry` every interval: numbers, units in the key names."""

    schema_version: int = Field(
        default=SCHEMA_VERSION, alias="schema", description="Telemetry schema version."
    )
    ts: float = Field(description="Unix seconds at the end of the interval.")
    interval_s: float = Field(gt=0.0, description="Seconds the figures cover.")
    pipelines: dict[str, PipelineTelemetry] = Field(description="Per pipeline id.")
    models: dict[str, ModelTelemetry] = Field(description="Per model name.")
    agent: AgentTelemetry = Field(description="The agent itself.")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class DetectionEvent(_Strict):
    """A tracked object, in Frigate's event shape: new, then updates, then end."""

    kind: Literal["detection"] = Field(default="detection", description="Event selector.")
    type: Literal["new", "update", "end"] = Field(description="Phase of the object's life.")
    id: str = Field(description="Track id, stable while the object is seen.")
    pipeline: str = Field(description="Pipeline (camera) id.")
    label: str = Field(description="Class label.")
    score: float = Field(description="Best score so far.")
    box: tuple[float, float, float, float] = Field(description="x0, y0, x1, y1 in frame pixels.")
    start_time: float = Field(description="Unix seconds when first seen.")
    end_time: float | None = Field(default=None, description="Unix seconds when gone (end).")
    zones: list[str] = Field(
        default_factory=list,
        description="Zones the object's latest box is in (its bottom centre), in the "
        "pipeline spec's order; empty when it is in none, or the pipeline has no zones.",
    )


class AgentEvent(_Strict):
    """Something that happened to a model, a pipeline or a job."""

    kind: Literal[
        "model_activated",
        "model_rolled_back",
        "model_health_failed",
        "pipeline_started",
        "pipeline_failed",
        "pipeline_stopped",
        "model_swapped",
        "source_lost",
        "calibration_done",
        "rule",
    ] = Field(description="What happened.")
    ts: float = Field(description="Unix seconds when it happened.")
    pipeline: str | None = Field(default=None, description="Pipeline concerned.")
    model: str | None = Field(default=None, description="Model concerned.")
    version: int | None = Field(default=None, description="Model version concerned.")
    code: str | None = Field(default=None, description="Error code, for failures.")
    detail: str = Field(default="", description="Human-readable detail.")


Event = Annotated[DetectionEvent | AgentEvent, Field(discriminator="kind")]


class EventMessage(_Strict):
    """On `<prefix>/<device>/events`."""

    device_id: str = Field(description="Device it happened on.")
    event: Event = Field(description="The event.")


class ResultMessage(_Strict):
    """On `<prefix>/<device>/results/<pipeline>`: one frame's decoded results."""

    pipeline: str = Field(description="Pipeline id.")
    frame: int = Field(description="Frame index in the source.")
    ts: float = Field(description="Unix seconds when the frame was read.")
    stream_ts: float = Field(description="Seconds into the stream (media time for files).")
    model: str = Field(description="Model that produced the results.")
    results: list[dict[str, Any]] = Field(description="Detections, classes, text boxes, ...")
    zones: list[list[str]] | None = Field(
        default=None,
        description="Per entry of `results`, the zones its box's bottom centre is in (empty "
        "when in none, and for results without a box); absent when the pipeline has no zones.",
    )

    @model_validator(mode="after")
    def _zones_match_results(self) -> ResultMessage:
        if self.zones is not None and len(self.zones) != len(self.results):
            raise ValueError(
                f"zones has {len(self.zones)} entries for {len(self.results)} results;"
                " it must have one per result"
            )
        return self


def all_messages() -> dict[str, type[BaseModel]]:
    """Every message and argument model by name, for schema export."""
    messages: dict[str, type[BaseModel]] = {
        "Command": Command,
        "Response": Response,
        "State": State,
        "Telemetry": Telemetry,
        "EventMessage": EventMessage,
        "ResultMessage": ResultMessage,
    }
    for name, args in COMMAND_ARGS.items():
        messages[f"args.{name}"] = args
    return messages
