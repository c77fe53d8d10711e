"""Broker flags shared by `edge-fleet` and `edge-agent models pull`, as mosquitto_sub spells
them: -h HOST -p PORT -u USER -P PASSWORD --cafile F --cert F --key F, or --broker URL."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import SecretStr, ValidationError

from edge_agent.comms.settings import BrokerSettings, TlsSettings, split_url
from edge_agent.config_files import first_error, read_secret
from edge_agent.errors import EdgeAgentError


def add_broker_args(parser: argparse.ArgumentParser, *, short: bool = True) -> None:
    """Add the broker flags; `short=False` leaves out -h/-p/-u/-P (for parsers with -h help)."""
    fields = BrokerSettings.model_fields
    group = parser.add_argument_group("broker (as mosquitto_sub)")
    group.add_argument("--broker", metavar="URL", help="mqtt://[user@]host[:port] or mqtts://")
    group.add_argument(
        *(["-h"] if short else []),
        "--host",
        help=f"broker host (default: {fields['host'].default})",
    )
    group.add_argument(
        *(["-p"] if short else []),
        "--port",
        type=int,
        help=f"broker port (default: {fields['port'].default}, 8883 with TLS)",
    )
    group.add_argument(*(["-u"] if short else []), "--username", help="user name")
    group.add_argument(*(["-P"] if short else []), "--pw", dest="password", help="password")
    group.add_argument(
        "--password-file", type=Path, help="file holding the password (kept out of `ps`)"
    )
    group.add_argument("--cafile", type=Path, help="CA certificate: turns TLS on")
    group.add_argument("--cert", type=Path, help="client certificate (mutual TLS)")
    group.add_argument("--key-file", dest="tls_key", type=Path, help="client key (mutual TLS)")
    group.add_argument("--insecure", action="store_true", help="skip TLS host name checks")
    group.add_argument(
        "-V",
        "--mqtt-version",
        choices=["5", "3.1.1"],
        default="5",
        help="MQTT protocol (default: %(default)s)",
    )
    group.add_argument(
        "--client-id", default="", help="MQTT client id (default: one the broker assigns)"
    )


def broker_settings(args: argparse.Namespace, **overrides: object) -> BrokerSettings:
    """BrokerSettings from the flags (a URL first, then the separate flags on top)."""
    data: dict[str, object] = {"version": args.mqtt_version, "client_id": args.client_id}
    base = BrokerSettings.from_url(args.broker) if args.broker else BrokerSettings()
    if args.host:
        data["host"] = args.host
    if args.port is not None:
        data["port"] = args.port
    if args.username:
        data["username"] = args.username
    if args.password_file is not None:
        data["password"] = read_secret(
            args.password_file,
            "password file",
            "pass --password-file a readable text file whose first line is the password",
            "input.invalid",
        )
    elif args.password:
        data["password"] = SecretStr(args.password)
    if args.cafile or args.cert or args.insecure:
        for flag, path in (("--cafile", args.cafile), ("--cert", args.cert)):
            _readable(flag, path)
        _readable("--key-file", args.tls_key)
        data["tls"] = TlsSettings(
            ca_file=args.cafile, cert_file=args.cert, key_file=args.tls_key, insecure=args.insecure
        )
        # A colon is no port: `mqtt://fleet:pw@broker` and `mqtt://[fd00::5]` kept 1883
        # and spoke TLS to the plaintext listener. (`base` parsed the URL: it is valid.)
        if args.port is None and not (args.broker and split_url(args.broker).port is not None):
            data["port"] = 8883
    data.update(overrides)
    # Validated whole, so a port out of range is refused here and not after a connect timeout.
    try:
        return BrokerSettings.model_validate({**dict(base), **data})
    except ValidationError as exc:
        where, message = first_error(exc)
        raise EdgeAgentError(
            f"broker option {where} is invalid: {message}",
            "see --help for the broker flags (a port is 1 to 65535)",
            code="input.invalid",
        ) from None


def _readable(flag: str, path: Path | None) -> None:
    if path is None:
        return
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise EdgeAgentError(
            f"{flag} {path}: {exc.strerror}",
            f"pass {flag} a readable PEM file",
            code="input.invalid",
        ) from None
