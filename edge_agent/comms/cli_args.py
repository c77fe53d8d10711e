"""Broker flags shared by `edge-fleet` and `edge-agent models pull`, as mosquitto_sub spells
them: -h HOST -p PORT -u USER -P PASSWORD --cafile F --cert F --key F, or --broker URL."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import SecretStr

from edge_agent.comms.settings import BrokerSettings, TlsSettings


def add_broker_args(parser: argparse.ArgumentParser, *, short: bool = True) -> None:
    """Add the broker flags; `short=False` leaves out -h/-p/-u/-P (for parsers with -h help)."""
    group = parser.add_argument_group("broker (as mosquitto_sub)")
    group.add_argument("--broker", metavar="URL", help="mqtt://[user@]host[:port] or mqtts://")
    group.add_argument(*(["-h"] if short else []), "--host", help="broker host")
    group.add_argument(*(["-p"] if short else []), "--port", type=int, help="broker port")
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
        "-V", "--mqtt-version", choices=["5", "3.1.1"], default="5", help="MQTT protocol"
    )
    group.add_argument("--client-id", default="", help="MQTT client id")


def broker_settings(args: argparse.Namespace, **overrides: object) -> BrokerSettings:
    """BrokerSettings from the flags (a URL first, then the separate flags on top)."""
    data: dict[str, object] = {"version": args.mqtt_version, "client_id": args.client_id}
    base = BrokerSettings.from_url(args.broker) if args.broker else BrokerSettings()
    if args.host:
        data["host"] = args.host
    if args.port:
        data["port"] = args.port
    if args.username:
        data["username"] = args.username
    if args.password_file is not None:
        lines = args.password_file.read_text(encoding="utf-8").splitlines()
        data["password"] = SecretStr(lines[0] if lines else "")
    elif args.password:
        data["password"] = SecretStr(args.password)
    if args.cafile or args.cert or args.insecure:
        data["tls"] = TlsSettings(
            ca_file=args.cafile, cert_file=args.cert, key_file=args.tls_key, insecure=args.insecure
        )
        if not args.port and not (args.broker and ":" in args.broker.split("://")[-1]):
            data["port"] = 8883
    data.update(overrides)
    return base.model_copy(update=data)
