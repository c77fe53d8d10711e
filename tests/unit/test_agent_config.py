"""The agent config: the smallest file works, env overrides, secrets stay secret."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edge_agent import __version__
from edge_agent.config.agent import load_agent_config
from edge_agent.errors import EdgeAgentError

SMALLEST = """
device_id = "dock-7"
state_dir = "/var/lib/edge-agent"
trusted_keys = ["/etc/edge-agent/fleet.pub"]
[mqtt]
host = "broker.plant.lan"
port = 1883
keepalive = 30
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_the_smallest_config_loads_with_defaults(tmp_path: Path) -> None:
    config = load_agent_config(_write(tmp_path, SMALLEST), {})
    assert config.device_id == "dock-7"
    assert config.mqtt.version == "5"
    assert config.telemetry_interval_s == 10.0
    assert config.layout({}).state == Path("/var/lib/edge-agent")
    assert config.layout({"CACHE_DIRECTORY": "/var/cache/edge-agent"}).cache == Path(
        "/var/cache/edge-agent"
    )


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    env = {"EDGE_AGENT_MQTT_HOST": "10.0.0.9", "EDGE_AGENT_MQTT_PORT": "8883"}
    config = load_agent_config(_write(tmp_path, SMALLEST), env)
    assert (config.mqtt.host, config.mqtt.port) == ("10.0.0.9", 8883)


def test_password_comes_from_a_credential_and_never_shows(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mqtt").write_text("hunter2\n")
    text = SMALLEST + 'username = "dock"\npassword_credential = "mqtt"\n'
    config = load_agent_config(_write(tmp_path, text), {"CREDENTIALS_DIRECTORY": str(creds)})
    assert config.mqtt.password is not None
    assert config.mqtt.password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(config)
    assert "hunter2" not in config.model_dump_json()
    assert "hunter2" not in config.config_hash()


def test_inline_password_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError) as info:
        load_agent_config(_write(tmp_path, SMALLEST + 'password = "hunter2"\n'), {})
    assert info.value.code == "config.invalid"
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (SMALLEST.replace('"dock-7"', '"dock/7"'), "device_id"),
        # A word of the fleet-wide topics: <prefix>/fleet/delivery/repair is no box's.
        (SMALLEST.replace('"dock-7"', '"fleet"'), "device_id"),
        (SMALLEST.replace("1883", "70000"), "mqtt.port"),
        (SMALLEST + "colour = 3\n", "mqtt.colour"),
        ('device_id = "a"\n', "mqtt"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(EdgeAgentError) as info:
        load_agent_config(_write(tmp_path, text), {})
    assert f"at {where}" in str(info.value)
    assert info.value.code == "config.invalid"


def test_missing_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError, match="does not exist"):
        load_agent_config(tmp_path / "nope.toml", {})


def test_a_bad_value_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('device_id = "d1"\n[mqtt]\nhost = "h"\nport = 1883\n')
    with pytest.raises(EdgeAgentError) as caught:
        load_agent_config(config, {"EDGE_AGENT_MQTT_PORT": "abc"})
    assert str(caught.value).startswith("$EDGE_AGENT_MQTT_PORT is invalid at mqtt.port")
    config.write_text('device_id = "d1"\n[mqtt]\nhost = "h"\nport = "abc"\n')
    with pytest.raises(EdgeAgentError) as caught:
        load_agent_config(config, {})
    assert str(caught.value).startswith(f"agent config {config} is invalid at mqtt.port")


def test_a_folder_as_the_config_says_so(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError) as caught:
        load_agent_config(tmp_path, {})
    assert "TOML syntax" not in str(caught.value)
    assert caught.value.code == "config.invalid"


def test_an_option_this_version_lacks_says_so_and_how_to_fix_it(tmp_path: Path) -> None:
    # After a downgrade, or a config rolled out ahead of its agent, the unit restarted ten
    # times into "Extra inputs are not permitted" and stayed down.
    with pytest.raises(EdgeAgentError) as info:
        load_agent_config(_write(tmp_path, "new_option = 1\n" + SMALLEST), {})
    assert "at new_option" in info.value.problem
    assert f"edge-agent {__version__} has no such option" in info.value.problem
    assert "upgrade edge-agent" in info.value.fix


def test_a_value_over_a_bound_added_since_is_capped_and_said_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 16 MiB loaded before the 8 MiB bound came; refused after an upgrade, the agent
    # restarted every 10 s under systemd and never came online.
    text = "max_command_bytes = 16777216\n" + SMALLEST
    caplog.set_level(logging.WARNING, logger="edge_agent.config.agent")
    config = load_agent_config(_write(tmp_path, text), {})
    assert config.max_command_bytes == 8 * 1024 * 1024
    [said] = [r for r in caplog.records if r.getMessage() == "config_value_capped"]
    assert said.levelno == logging.WARNING
    fields = said.fields  # type: ignore[attr-defined]
    assert (fields["field"], fields["value"], fields["used"]) == (
        "max_command_bytes",
        16 * 1024 * 1024,
        8 * 1024 * 1024,
    )
    assert "16 MiB" in fields["why"]
    # A value within the bound is taken as it is, and unsaid; one that is no number is
    # still refused.
    caplog.clear()
    text = "max_command_bytes = 1048576\n" + SMALLEST
    assert load_agent_config(_write(tmp_path, text), {}).max_command_bytes == 1024 * 1024
    assert not [r for r in caplog.records if r.getMessage() == "config_value_capped"]
    with pytest.raises(EdgeAgentError) as info:
        load_agent_config(_write(tmp_path, 'max_command_bytes = "16M"\n' + SMALLEST), {})
    assert info.value.code == "config.invalid"


def test_every_key_a_string_can_set_has_its_override(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mqtt").write_text("hunter2\n")
    env = {
        "EDGE_AGENT_MAX_PIPELINES": "5",
        "EDGE_AGENT_MAX_COMMAND_BYTES": "4096",
        "EDGE_AGENT_MQTT_SESSION_EXPIRY_S": "60",
        "EDGE_AGENT_MQTT_RECONNECT_MIN_S": "0.5",
        "EDGE_AGENT_MQTT_RECONNECT_MAX_S": "7",
        "EDGE_AGENT_MQTT_PASSWORD_CREDENTIAL": "mqtt",
        "CREDENTIALS_DIRECTORY": str(creds),
    }
    config = load_agent_config(_write(tmp_path, SMALLEST), env)
    assert (config.max_pipelines, config.max_command_bytes) == (5, 4096)
    mqtt = config.mqtt
    assert (mqtt.session_expiry_s, mqtt.reconnect_min_s, mqtt.reconnect_max_s) == (60, 0.5, 7.0)
    assert mqtt.password is not None
    assert mqtt.password.get_secret_value() == "hunter2"


def test_a_variable_no_override_reads_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="edge_agent.config.agent")
    env = {
        "EDGE_AGENT_MQTT_HOSTNAME": "10.0.0.9",  # a typo
        "EDGE_AGENT_TRUSTED_KEYS": "/etc/edge-agent/fleet.pub",  # a list: the file's
        "EDGE_AGENT_MQTT_PASSWORD": "hunter2",  # never inline, here neither
        "EDGE_AGENT_CACHE": "/tmp/cache",  # the CLI's, not the config's
        "EDGE_AGENT_MQTT_PORT": "8883",
    }
    config = load_agent_config(_write(tmp_path, SMALLEST), env)
    assert config.mqtt.host == "broker.plant.lan"
    assert config.mqtt.password is None
    said = [r for r in caplog.records if r.getMessage() == "config_env_unread"]
    assert [r.fields["variable"] for r in said] == [  # type: ignore[attr-defined]
        "EDGE_AGENT_MQTT_HOSTNAME",
        "EDGE_AGENT_MQTT_PASSWORD",
        "EDGE_AGENT_TRUSTED_KEYS",
    ]
    assert "hunter2" not in repr([r.fields for r in said])  # type: ignore[attr-defined]


@pytest.mark.parametrize("table", ['"broker.plant.lan"', "5", '["hx"]'])
def test_an_mqtt_that_is_not_a_table_is_refused_by_name(tmp_path: Path, table: str) -> None:
    text = f'device_id = "dock-7"\nmqtt = {table}\n'
    with pytest.raises(EdgeAgentError) as info:
        load_agent_config(_write(tmp_path, text), {"EDGE_AGENT_MQTT_PORT": "1883"})
    assert info.value.code == "config.invalid"
    assert "at mqtt:" in str(info.value)


@pytest.mark.parametrize("host", ["", "mqtt://broker:1883", "broker:1883", "broker lan", "a/b"])
def test_a_host_that_cannot_be_one_is_refused(tmp_path: Path, host: str) -> None:
    with pytest.raises(EdgeAgentError) as info:
        load_agent_config(_write(tmp_path, SMALLEST.replace("broker.plant.lan", host)), {})
    assert "at mqtt.host" in str(info.value)


@pytest.mark.parametrize("host", ["::1", "fe80::1%eth0", "10.0.0.9", "broker"])
def test_addresses_and_names_are_hosts(tmp_path: Path, host: str) -> None:
    config = load_agent_config(_write(tmp_path, SMALLEST.replace("broker.plant.lan", host)), {})
    assert config.mqtt.host == host
