"""The command lines, as an operator runs them: edge-fleet keygen, publish-model, serve,
and edge-agent models pull, each a real process against a real mosquitto."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edge_agent.catalog.catalog import ResolvedModel, default_models_dir
from edge_agent.comms.local_broker import LocalBroker

REPO = Path(__file__).resolve().parents[2]
FLEET = [sys.executable, "-m", "edge_agent.fleet.cli"]
AGENT = [sys.executable, "-c", "import sys; from edge_agent.cli.main import main; sys.exit(main())"]


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, **kw)  # type: ignore[call-overload, no-any-return]


def test_keygen_publish_serve_pull(
    broker: LocalBroker, tmp_path: Path, resolve: Callable[[str], ResolvedModel]
) -> None:
    env = {**os.environ, "EDGE_FLEET_REPO": str(tmp_path / "repo")}
    key = tmp_path / "keys" / "fleet.key"
    made = _run([*FLEET, "keygen", str(key)])
    assert made.returncode == 0, made.stderr
    assert key.stat().st_mode & 0o777 == 0o600
    model = resolve("text-orientation")
    folder = tmp_path / "release"
    folder.mkdir()
    shutil.copyfile(model.path, folder / "orient.onnx")
    shutil.copyfile(default_models_dir() / "text-orientation.toml", folder / "orient.toml")
    broker_flags = ["-h", broker.host, "-p", str(broker.port)]
    published = _run(
        [
            *FLEET,
            "publish-model",
            str(folder / "orient.onnx"),
            "--name",
            "orient",
            "--version",
            "3",
            "--key",
            str(key),
            *broker_flags,
        ],
        env=env,
    )
    assert published.returncode == 0, published.stderr
    assert "published orient v3" in published.stdout
    server = subprocess.Popen(
        [*FLEET, "serve", "--instance", "cli-1", *broker_flags],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert "ready" in server.stdout.readline()
        state = tmp_path / "state"
        pulled = _run(
            [
                *AGENT,
                "--state-dir",
                str(state),
                "models",
                "pull",
                "orient",
                "--broker",
                broker.url,
                "--trusted-key",
                str(key.with_name("fleet.key.pub")),
            ],
        )
        assert pulled.returncode == 0, pulled.stderr
        assert "orient v3: pulled" in pulled.stdout
        again = _run(
            [
                *AGENT,
                "--state-dir",
                str(state),
                "models",
                "pull",
                "orient",
                "--broker",
                broker.url,
                "--version",
                "2",
                "--timeout",
                "1",
            ]
        )
        assert again.returncode == 2
        # One line: no "release   0%" meter before it (progress is drawn on a terminal only).
        lines = again.stderr.splitlines()
        assert len(lines) == 1, again.stderr
        assert lines[0].startswith("edge-agent: error:")
        assert lines[0].endswith("[transfer.failed]")  # v2 was never published
    finally:
        server.terminate()
        server.communicate(timeout=10)
    assert server.returncode == 0


def test_pull_refuses_a_device_id_no_topic_can_carry(broker: LocalBroker, tmp_path: Path) -> None:
    # Taken as given, '+' went on to the broker: with a release published, the join's publish
    # on a topic with a wildcard was a paho traceback, and 'a/b' asked on another box's topics.
    for bad in ("+", "a/b", "#"):
        pulled = _run(
            [*AGENT, "--state-dir", str(tmp_path / "state"), "models", "pull", "orient",
             "--broker", broker.url, "--device-id", bad, "--timeout", "1"]
        )  # fmt: skip
        assert pulled.returncode == 2, pulled.stderr
        lines = pulled.stderr.splitlines()
        assert len(lines) == 1, pulled.stderr
        assert lines[0].startswith("edge-agent: error:"), lines[0]
        assert "device id" in lines[0]


def test_publish_with_a_mirror_and_pull_from_it_with_no_fleet_server(
    broker: LocalBroker, tmp_path: Path, resolve: Callable[[str], ResolvedModel]
) -> None:
    # No `edge-fleet serve` runs: every byte must come from the mirror the release names.
    model = resolve("text-orientation")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copyfile(model.path, mirror / "orient-v1.onnx")
    shutil.copyfile(default_models_dir() / "text-orientation.toml", mirror / "orient-v1.toml")
    asked: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, directory=str(mirror), **kw)

        def log_message(self, format: str, *args: object) -> None:
            asked.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "EDGE_FLEET_REPO": str(tmp_path / "repo")}
    key = tmp_path / "fleet.key"
    try:
        assert _run([*FLEET, "keygen", str(key)]).returncode == 0
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        published = _run(
            [*FLEET, "publish-model", str(mirror / "orient-v1.onnx"), "--name", "orient",
             "--version", "1", "--key", str(key), "--url-base", base,
             "-h", broker.host, "-p", str(broker.port)],
            env=env,
        )  # fmt: skip
        assert published.returncode == 0, published.stderr
        pulled = _run(
            [*AGENT, "--state-dir", str(tmp_path / "state"), "models", "pull", "orient",
             "--broker", broker.url, "--trusted-key", str(key.with_name("fleet.key.pub")),
             "--timeout", "20"]
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert pulled.returncode == 0, pulled.stderr
    assert "orient v1: pulled" in pulled.stdout
    assert asked
    assert all(a == "/orient-v1.onnx" for a in asked), asked

    refused = _run([*FLEET, "publish-model", str(mirror / "orient-v1.onnx"), "--version", "2",
                    "--key", str(key), "--url-base", "ftp://mirror/models"], env=env)  # fmt: skip
    assert refused.returncode == 2
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "ftp://mirror/models" in refused.stderr
