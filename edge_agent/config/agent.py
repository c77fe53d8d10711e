"""The agent's configuration: one TOML file, environment overrides, secrets from files.

The smallest file that works names a device and a broker:

    device_id = "dock-7"
    [mqtt]
    host = "broker.plant.lan"

Everything else has a default a box can run on. Overrides come from the
environment as `EDGE_AGENT_<KEY>` for top-level keys and `EDGE_AGENT_MQTT_<KEY>`
for `[mqtt]` keys (e.g. EDGE_AGENT_MQTT_HOST), so a unit drop-in or a
container can change the broker without editing the file. Secrets are never
inline: a password comes from `password_file` or from a systemd credential
(`password_credential`, read from `$CREDENTIALS_DIRECTORY`) and is held as a
SecretStr, so it never reaches a log, a repr or the `state` message.

Models here do no I/O; `load_agent_config` is the one function that reads
files and the environment, and it is handed the environment to read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
)

from edge_agent import __version__
from edge_agent.config_files import first_error, read_secret
from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import FAULT_ENV
from edge_agent.logs import log_event
from edge_agent.paths import Layout, is_safe_name
from edge_agent.protocol.topics import RESERVED_IDS, check_prefix

log = logging.getLogger(__name__)

MAX_COMMAND_BYTES = 8 * 1024 * 1024
"""The most `max_command_bytes` can be: past 16 MiB the broker drops a command for the agent
on MQTT 5 (service.AGENT_MAX_PACKET_BYTES) unseen, where it should be answered too large."""


class TlsConfig(BaseModel):
    """TLS to the broker; mutual TLS when a client certificate is given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path | None = Field(
        default=None, description="CA bundle that signed the broker; None uses the system's."
    )
    cert_file: Path | None = Field(default=None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(default=None, description="Client private key (mutual TLS).")
    insecure: bool = Field(
        default=False, description="Skip hostname verification (test brokers only)."
    )


class MqttConfig(BaseModel):
    """How to reach the fleet's broker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(description="Broker host name or address.")
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port.")
    version: Literal["5", "3.1.1"] = Field(
        default="5", description="MQTT protocol version; 3.1.1 for brokers without v5."
    )
    keepalive: int = Field(
        default=30, ge=5, le=3600, description="Seconds; the broker declares us gone at 1.5x."
    )
    session_expiry_s: int = Field(
        default=7 * 24 * 3600,
        ge=0,
        description="MQTT 5 session expiry: QoS 1 commands sent while offline wait this long.",
    )
    client_id: str | None = Field(
        default=None, description="MQTT client id; default edge-agent-<device_id>."
    )
    username: str | None = Field(default=None, description="Broker user name.")
    password_file: Path | None = Field(
        default=None, description="File holding the broker password (first line)."
    )
    password_credential: str | None = Field(
        default=None, description="systemd credential name holding the password."
    )
    password: SecretStr | None = Field(
        default=None,
        description="Filled in from password_file or the credential at load; never set inline.",
        exclude=True,
    )
    tls: TlsConfig | None = Field(default=None, description="TLS settings; None is plain TCP.")
    reconnect_min_s: float = Field(default=1.0, gt=0, description="First reconnect delay.")
    reconnect_max_s: float = Field(default=60.0, gt=0, description="Longest reconnect delay.")

    @field_validator("host")
    @classmethod
    def _a_host(cls, value: str) -> str:
        # `mqtt://broker:1883`, edge-fleet's --broker form, was taken as a host name that
        # never resolves: the agent ran "broker unreachable" forever instead of refusing.
        if not value or any(c.isspace() or c == "/" for c in value) or value.count(":") == 1:
            raise ValueError(
                f"{value!r} is not a host name or address (no URL, no :port: the port is mqtt.port)"
            )
        return value


class HomeAssistantConfig(BaseModel):
    """Home Assistant MQTT discovery: entities appear in HA by themselves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="Publish discovery configs and occupancy.")
    prefix: str = Field(
        default="homeassistant", description="HA's discovery prefix (its MQTT settings)."
    )
    node_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Discovery node id; default: the device id with other characters as '_'.",
    )
    labels: list[str] = Field(
        default_factory=lambda: ["person"],
        description="Labels that get an occupancy binary_sensor on every pipeline, besides "
        "the labels its event rules watch.",
    )
    min_score: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Results scoring below this do not occupy."
    )
    off_delay_s: float = Field(
        default=5.0,
        ge=0.0,
        le=3600.0,
        description="Seconds without the label in results before occupancy turns OFF.",
    )

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_prefix(value)


class PrometheusConfig(BaseModel):
    """Prometheus metrics: a node_exporter textfile, a localhost /metrics endpoint, or both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    textfile: Path | None = Field(
        default=None,
        description="File for node_exporter's textfile collector (ends in .prom), rewritten "
        "atomically every telemetry interval.",
    )
    listen: str | None = Field(
        default=None,
        description="HOST:PORT for an HTTP /metrics endpoint; a bare PORT binds 127.0.0.1.",
    )

    @field_validator("textfile")
    @classmethod
    def _prom(cls, value: Path | None) -> Path | None:
        if value is not None and value.suffix != ".prom":
            raise ValueError("node_exporter only reads files ending in .prom")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            listen_address(value)
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) to serve /metrics on, or None."""
        return None if self.listen is None else listen_address(self.listen)


def listen_address(text: str) -> tuple[str, int]:
    """`127.0.0.1:9108`, `[::1]:9108` or `9108` (loopback) as (host, port)."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT with a port in 1..65535")
    return host, int(port)


class IntegrationsConfig(BaseModel):
    """Integrations users already know; every one is off until asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    homeassistant: HomeAssistantConfig = Field(
        default_factory=HomeAssistantConfig, description="Home Assistant MQTT discovery."
    )
    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig, description="Prometheus metrics."
    )
    journald: bool | Literal["auto"] = Field(
        default=False,
        description="Log to the journal with structured fields (PIPELINE=, MODEL=, "
        "COMMAND_ID=); auto: when run by systemd.",
    )


class AgentConfig(BaseModel):
    """The whole agent config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_id: str = Field(description="This box's id: the `<device_id>` in every topic.")
    group: str | None = Field(
        default=None, description="Fleet group; commands to edge/v1/group/<group>/cmd apply."
    )
    state_dir: Path | None = Field(
        default=None, description="Must-survive state; default $STATE_DIRECTORY, else XDG."
    )
    cache_dir: Path | None = Field(
        default=None, description="Rebuildable cache; default $CACHE_DIRECTORY, else XDG."
    )
    trusted_keys: list[Path] = Field(
        default_factory=list,
        description="Ed25519 public keys (PEM) releases must be signed by; empty: unverified.",
    )
    topic_prefix: str = Field(default="edge/v1", description="Prefix of every topic.")
    telemetry_interval_s: float = Field(
        default=10.0, ge=1.0, le=3600.0, description="Seconds between telemetry messages."
    )
    results: Literal["all", "detections", "events"] = Field(
        default="detections",
        description="Which frames go to results/<pipeline>: every frame, frames with results, "
        "or none (events only).",
    )
    outbox_quota_mb: float = Field(
        default=64.0, gt=0, description="Disk the outbox may hold while the broker is away."
    )
    max_command_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        le=MAX_COMMAND_BYTES,
        description="Larger command payloads are refused (answered command.too_large; over "
        "16 MiB the broker drops them for the agent on MQTT 5).",
    )
    # Each pipeline holds about four threads and over a megabyte even while its camera
    # refuses connections (100 held 404 threads and 138 MB), and all are restored at every
    # start. A box of a few cores serves about a dozen live streams well: 32 leaves room
    # for failed ones waiting for a retry, and bounds what commands can pile up.
    max_pipelines: int = Field(
        default=32,
        ge=1,
        description="Pipelines the agent runs at most (failed ones count until stopped, "
        "finished ones do not); a start_pipeline past it is refused command.busy, and a "
        "restart starts no more (the rest are listed failed, and kept for a restart with "
        "room).",
    )
    mqtt: MqttConfig = Field(description="The broker.")
    integrations: IntegrationsConfig = Field(
        default_factory=IntegrationsConfig,
        description="Home Assistant, Prometheus and journald; all off by default.",
    )

    @field_validator("device_id", "group")
    @classmethod
    def _one_topic_level(cls, value: str | None) -> str | None:
        # Ids become topic levels and file names: no wildcards, separators or '..'.
        if value is not None and not is_safe_name(value):
            raise ValueError("use letters, digits, '-', '_' and '.', starting with a letter/digit")
        return value

    @field_validator("device_id")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        # `<prefix>/fleet/...`, `<prefix>/delivery/...`: a device of such a name would
        # share its topics with the whole fleet's, and the fleet would not hear it.
        if value in RESERVED_IDS:
            raise ValueError(f"{', '.join(sorted(RESERVED_IDS))} name fleet-wide topics")
        return value

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_prefix(value)

    def layout(self, env: Mapping[str, str]) -> Layout:
        """Where this agent keeps its cache and state."""
        return Layout.from_env(env, cache=self.cache_dir, state=self.state_dir)

    def named_files(self) -> list[Path]:
        """The files this config has the agent read or write besides its own folders:
        the config file itself, trusted keys, the password file, TLS files, the metrics
        textfile."""
        tls = self.mqtt.tls
        files = [
            # It names the secrets: read as a pipeline's source or calibration data by a
            # command, it told where the password file and the TLS key are.
            self._file,
            *self.trusted_keys,
            self.mqtt.password_file,
            *((tls.ca_file, tls.cert_file, tls.key_file) if tls is not None else ()),
            self.integrations.prometheus.textfile,
        ]
        return [path for path in files if path is not None]

    _file: Path | None = PrivateAttr(default=None)
    """The file it was read from (`load_agent_config`)."""

    def config_hash(self) -> str:
        """A short digest of the effective config (secrets excluded), for `state`."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _scalar_fields(model: type[BaseModel], *, skip: frozenset[str] = frozenset()) -> frozenset[str]:
    """The fields of `model` one environment string can set: not a table, not a list."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        # `X | None` is one of its kinds; `list[X]` is a list, not an X.
        kinds = (field.annotation, *get_args(field.annotation))
        if name in skip or any(
            get_origin(k) is list or (isinstance(k, type) and issubclass(k, BaseModel))
            for k in kinds
        ):
            continue
        names.add(name)
    return frozenset(names)


# Every key a string can give, taken from the models: a hand-kept list read 8 of the 10
# top-level keys and 7 of the 11 [mqtt] ones, and a drop-in setting another (say
# EDGE_AGENT_MQTT_PASSWORD_CREDENTIAL) was dropped without a word. The password itself is
# never inline, from the file or the environment.
_TOP_LEVEL_ENV = _scalar_fields(AgentConfig)
_MQTT_ENV = _scalar_fields(MqttConfig, skip=frozenset({"password"}))
_OTHER_ENV = frozenset({"EDGE_AGENT_CACHE", "EDGE_AGENT_CONFIG", FAULT_ENV})
"""EDGE_AGENT_* variables that are not config overrides: the CLI's cache and config file,
and the tests' fault injection."""


def _unread_env(env: Mapping[str, str]) -> list[str]:
    """The EDGE_AGENT_* variables set in `env` that no override reads: a typo, a table's key
    or a list, which a unit drop-in would otherwise believe applied."""
    read = {f"EDGE_AGENT_{key.upper()}" for key in _TOP_LEVEL_ENV}
    read |= {f"EDGE_AGENT_MQTT_{key.upper()}" for key in _MQTT_ENV}
    return sorted(
        name
        for name, value in env.items()
        if name.startswith("EDGE_AGENT_") and value and name not in read | _OTHER_ENV
    )


_CAPS: dict[str, tuple[int | float, str]] = {
    "max_command_bytes": (
        MAX_COMMAND_BYTES,
        "past 16 MiB the broker drops commands for the agent on MQTT 5; a command between "
        "the two is answered command.too_large",
    ),
}
"""Upper bounds added after the first release, and why each is there. A config the build
before accepted is capped, with a warning, not refused: refused, an upgraded box restarted
every 10 s under systemd and never came online to be told."""


def _capped(data: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`data` with each value over its `_CAPS` bound set to the bound, and what was capped."""
    capped = dict(data)
    said: list[dict[str, Any]] = []
    for key, (bound, why) in _CAPS.items():
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > bound:
            capped[key] = bound
            said.append({"field": key, "value": value, "used": bound, "why": why})
    return capped, said


def _overrides(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    merged = dict(data)
    for key in sorted(_TOP_LEVEL_ENV):
        value = env.get(f"EDGE_AGENT_{key.upper()}")
        if value:
            merged[key] = value
    table = merged.get("mqtt")
    if table is not None and not isinstance(table, dict):
        return merged  # `mqtt = "broker"`: the model says it must be a table
    mqtt = dict(table or {})
    for key in sorted(_MQTT_ENV):
        value = env.get(f"EDGE_AGENT_MQTT_{key.upper()}")
        if value:
            mqtt[key] = value
    if mqtt:
        merged["mqtt"] = mqtt
    return merged


def _env_name(where: str) -> str | None:
    """The variable `_overrides` reads for the config field at dotted path `where`, if any."""
    match where.split("."):
        case [key] if key in _TOP_LEVEL_ENV:
            return f"EDGE_AGENT_{key.upper()}"
        case ["mqtt", key] if key in _MQTT_ENV:
            return f"EDGE_AGENT_MQTT_{key.upper()}"
    return None


def _read_secret(path: Path, what: str) -> SecretStr:
    return read_secret(
        path, what, "check the file exists and the agent's user can read it", "config.invalid"
    )


def load_agent_config(path: Path, env: Mapping[str, str], *, secrets: bool = True) -> AgentConfig:
    """Read, override from `env`, validate, and resolve secrets (unless `secrets` is False:
    `doctor --config` wants the folders, not the password the agent's user may read).

    Raises:
        EdgeAgentError: code config.invalid, naming the file and the first bad field.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EdgeAgentError(
            f"agent config {path} does not exist",
            "write one (see systemd/agent.example.toml) or pass --config",
            code="config.invalid",
        ) from None
    except OSError as exc:
        raise EdgeAgentError(
            f"agent config {path} is unreadable: {exc.strerror or exc}",
            "pass --config a TOML file the agent's user can read",
            code="config.invalid",
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise EdgeAgentError(
            f"agent config {path} is unreadable: {exc}",
            "fix the TOML syntax",
            code="config.invalid",
        ) from None
    data = _overrides(data, env)
    if isinstance(data.get("mqtt"), dict) and "password" in data["mqtt"]:
        raise EdgeAgentError(
            f"agent config {path} has an inline mqtt.password",
            "put the password in a file named by mqtt.password_file, or a systemd credential "
            "(mqtt.password_credential)",
            code="config.invalid",
        )
    data, capped = _capped(data)
    try:
        config = AgentConfig.model_validate(data)
    except ValidationError as exc:
        where, message = first_error(exc)
        # Name where the bad value came from: an EDGE_AGENT_* variable overrides the file.
        variable = _env_name(where)
        source = f"${variable}" if variable and env.get(variable) else f"agent config {path}"
        fix = "see the config reference in the README"
        if exc.errors()[0]["type"] == "extra_forbidden":
            # After a downgrade, or a config rolled out ahead of the agent: it says which.
            message = f"edge-agent {__version__} has no such option (a typo, or a newer one)"
            fix = f"remove it, or upgrade edge-agent to the version it was written for; {fix}"
        raise EdgeAgentError(
            f"{source} is invalid at {where}: {message}", fix, code="config.invalid"
        ) from None
    config._file = path
    for name in _unread_env(env):
        log_event(
            log,
            logging.WARNING,
            "config_env_unread",
            variable=name,
            fix="no config key has this name (lists and tables are set in the file); unset "
            "it, or fix its spelling",
        )
    for cap in capped:
        log_event(
            log,
            logging.WARNING,
            "config_value_capped",
            config=str(path),
            **cap,
            fix=f"set {cap['field']} to at most {cap['used']} in the config",
        )
    return _with_password(config, env) if secrets else config


def _with_password(config: AgentConfig, env: Mapping[str, str]) -> AgentConfig:
    mqtt = config.mqtt
    secret: SecretStr | None = None
    if mqtt.password_file is not None:
        secret = _read_secret(mqtt.password_file, "mqtt password")
    elif mqtt.password_credential is not None:
        folder = env.get("CREDENTIALS_DIRECTORY")
        if not folder:
            raise EdgeAgentError(
                f"mqtt.password_credential is {mqtt.password_credential!r} but "
                "$CREDENTIALS_DIRECTORY is not set",
                "run under systemd with LoadCredential=, or use mqtt.password_file",
                code="config.invalid",
            )
        if not is_safe_name(mqtt.password_credential):
            raise EdgeAgentError(
                f"bad credential name {mqtt.password_credential!r}",
                "use the name given to LoadCredential=",
                code="config.invalid",
            )
        secret = _read_secret(Path(folder) / mqtt.password_credential, "mqtt credential")
    if secret is None:
        return config
    return config.model_copy(update={"mqtt": mqtt.model_copy(update={"password": secret})})
