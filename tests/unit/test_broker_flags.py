"""The broker flags every command line shares (comms/cli_args.py), turned into settings."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from edge_agent.comms.cli_args import add_broker_args, broker_settings


def _settings(*argv: str) -> tuple[int, bool]:
    parser = argparse.ArgumentParser(add_help=False)
    add_broker_args(parser)
    settings = broker_settings(parser.parse_args(list(argv)))
    return settings.port, settings.tls is not None


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("mqtt://broker.example", 8883),
        # A colon that is no port: the password's, an IPv6 address's. Both kept 1883 and
        # spoke TLS to the plaintext listener.
        ("mqtt://fleet:s3cret@broker.example", 8883),
        ("mqtt://[fd00::5]", 8883),
        ("mqtt://fleet:s3cret@[fd00::5]", 8883),
        ("mqtt://broker.example:1884", 1884),
        ("mqtt://[fd00::5]:1884", 1884),
    ],
)
def test_cafile_takes_the_tls_port_unless_the_url_names_one(
    url: str, port: int, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")  # read at connect, not here
    assert _settings("--broker", url, "--cafile", str(ca)) == (port, True)
    assert _settings("--broker", url)[0] == (port if port == 1884 else 1883)
