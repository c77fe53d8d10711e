"""The [integrations] table: all off by default, strict, with readable errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.config.agent import AgentConfig, load_agent_config
from edge_agent.errors import EdgeAgentError

MINIMAL = 'device_id = "dock-7"\n[mqtt]\nhost = "localhost"\n'


def _load(tmp_path: Path, extra: str) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(MINIMAL + extra, encoding="utf-8")
    return load_agent_config(path, {})


def test_every_integration_is_off_by_default(tmp_path: Path) -> None:
    integrations = _load(tmp_path, "").integrations
    assert not integrations.homeassistant.enabled
    assert integrations.prometheus.textfile is None
    assert integrations.prometheus.address is None
    assert integrations.journald is False


def test_a_full_table_loads(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        """
[integrations]
journald = "auto"
[integrations.homeassistant]
enabled = true
prefix = "ha/"
node_id = "dock_7"
labels = ["person", "car"]
off_delay_s = 2
[integrations.prometheus]
textfile = "/var/lib/node_exporter/textfile_collector/edge_agent.prom"
listen = "9108"
""",
    ).integrations
    assert config.journald == "auto"
    assert config.homeassistant.prefix == "ha"
    assert config.homeassistant.labels == ["person", "car"]
    assert config.prometheus.address == ("127.0.0.1", 9108)


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("127.0.0.1:9108", ("127.0.0.1", 9108)),
        ("[::1]:9000", ("::1", 9000)),
        (":80", ("127.0.0.1", 80)),
    ],
)
def test_listen_addresses(tmp_path: Path, listen: str, address: tuple[str, int]) -> None:
    config = _load(tmp_path, f'[integrations.prometheus]\nlisten = "{listen}"\n')
    assert config.integrations.prometheus.address == address


@pytest.mark.parametrize(
    ("section", "line"),
    [
        ("", "grafana = true"),
        (".homeassistant", "enable = true"),
        (".homeassistant", 'node_id = "dock 7"'),
        (".homeassistant", 'prefix = "ha/#"'),
        (".prometheus", 'textfile = "/tmp/metrics.txt"'),
        (".prometheus", 'listen = "localhost"'),
        ("", 'journald = "sometimes"'),
    ],
)
def test_mistakes_name_the_field(tmp_path: Path, section: str, line: str) -> None:
    with pytest.raises(EdgeAgentError) as err:
        _load(tmp_path, f"[integrations{section}]\n{line}\n")
    assert err.value.code == "config.invalid"
    where = f"integrations{section}.{line.split(' ')[0]}"
    assert f"at {where}" in str(err.value)
