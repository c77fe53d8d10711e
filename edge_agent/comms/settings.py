"""How to reach a broker: host, protocol version, session, TLS, credentials (no I/O).

`BrokerSettings.from_url` takes the `--broker mqtt://user@host:port` form the
CLIs accept; `mqtts://` turns TLS on with the system's CAs.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from edge_agent.comms.base import MqttVersion
from edge_agent.errors import EdgeAgentError


class TlsSettings(BaseModel):
    """TLS to the broker; mutual TLS when a client certificate and key are given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path | None = Field(default=None, description="CA bundle; None: the system's.")
    cert_file: Path | None = Field(default=None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(default=None, description="Client private key (mutual TLS).")
    insecure: bool = Field(default=False, description="Skip host name checks (test brokers).")


class BrokerSettings(BaseModel):
    """One MQTT session's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="Broker host name or address.")
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port.")
    version: MqttVersion = Field(default="5", description="MQTT 5, or 3.1.1 for older brokers.")
    keepalive: int = Field(default=30, ge=5, le=3600, description="Seconds between pings.")
    client_id: str = Field(default="", description="Client id; '' lets the broker pick one.")
    persistent: bool = Field(
        default=False,
        description="Keep the session (subscriptions, queued QoS 1) while disconnected: "
        "MQTT 5 session expiry, or 3.1.1 clean_session=false. Needs a fixed client_id.",
    )
    session_expiry_s: int = Field(
        default=7 * 24 * 3600, ge=0, description="MQTT 5 session expiry when persistent."
    )
    username: str | None = Field(default=None, description="User name.")
    password: SecretStr | None = Field(default=None, description="Password (never logged).")
    tls: TlsSettings | None = Field(default=None, description="TLS; None is plain TCP.")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP+CONNECT timeout.")
    reconnect_min_s: float = Field(default=0.5, gt=0, description="First reconnect delay.")
    reconnect_max_s: float = Field(default=30.0, gt=0, description="Longest reconnect delay.")
    stable_after_s: float = Field(
        default=10.0,
        ge=0,
        description="A link up at least this long starts the reconnect backoff again; one lost "
        "sooner (another client taking over the same client id) keeps backing off.",
    )
    max_packet_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="MQTT 5: the largest packet this client takes (Maximum Packet Size); the "
        "broker drops a larger message for it instead of sending it. None: no limit.",
    )
    dispatch_limit_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Received bytes waiting for handlers; past it QoS 0 messages are dropped.",
    )

    @classmethod
    def from_url(cls, url: str, **overrides: object) -> BrokerSettings:
        """Parse `mqtt://[user[:password]@]host[:port]` (or `mqtts://`, `tcp://`).

        Raises:
            EdgeAgentError: input.invalid for another scheme or no host.
        """
        bad = EdgeAgentError(
            f"broker URL {url!r} is not mqtt://host[:port] or mqtts://host[:port]",
            "pass e.g. --broker mqtt://127.0.0.1:1883 (a port from 1 to 65535)",
            code="input.invalid",
        )
        try:
            parts = split_url(url)
            port = parts.port  # raises for a port that is not a number from 0 to 65535
        except ValueError:
            raise bad from None
        if parts.scheme not in ("mqtt", "tcp", "mqtts", "ssl") or not parts.hostname or port == 0:
            raise bad
        tls = parts.scheme in ("mqtts", "ssl")
        data: dict[str, object] = {
            "host": parts.hostname,
            "port": port or (8883 if tls else 1883),
        }
        if parts.username:
            data["username"] = unquote(parts.username)
        if parts.password:
            data["password"] = SecretStr(unquote(parts.password))
        if tls:
            data["tls"] = TlsSettings()
        data.update(overrides)
        return cls.model_validate(data)


def split_url(url: str) -> SplitResult:
    """A broker URL's parts, a bare `host[:port]` taken as mqtt://; `.port` raises
    ValueError for one that is not a number from 0 to 65535."""
    return urlsplit(url if "://" in url else f"mqtt://{url}")
