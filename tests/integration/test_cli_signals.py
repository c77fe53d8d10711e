"""Ctrl-C and SIGTERM on `edge-agent run-pipeline`: a real signal to a real process.

The source is an endless MJPEG stream, so only the signal can end the run. Wanted:
the pipeline stops through its stop path within 2 s, the summary so far is printed
(the JSON line on stdout, or the table on stderr, also when the live table was
showing on a terminal), and the exit code is 128 + the signal; never an abort.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.clips import bgr, sample
from tests.integration.mjpeg_server import MjpegServer, free_port

STOP_BOUND_S = 2.0
CRASH_MARKS = ("Traceback", "terminate called", "Aborted", "ended without a result")


@pytest.fixture(scope="module")
def stream(resolve: Callable[[str], ResolvedModel]) -> Iterator[str]:
    resolve("person-ssdlite")  # fetched before the subprocess needs it
    server = MjpegServer(bgr(sample("astronaut")), free_port(), fps=25.0)
    server.start()
    yield server.url
    server.stop()


def spawn(args: list[str], tmp_path: Path, stderr: int | IO[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, EDGE_AGENT_STATE_DIR=str(tmp_path / "state"))
    return subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "run-pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )


def signal_and_time(proc: subprocess.Popen[str], signum: int) -> float:
    """Send `signum`; seconds until the process has exited."""
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=30)
    return time.monotonic() - sent


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_json_mode_prints_the_summary_and_exits_128_plus_signal(
    stream: str, tmp_path: Path, signum: int
) -> None:
    args = ["--model", "person-ssdlite", "--source", stream, "--json"]
    with spawn(args, tmp_path, subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        frames = [proc.stdout.readline() for _ in range(5)]  # running: five frames are out
        assert all('"frame"' in line for line in frames), frames
        took = signal_and_time(proc, signum)
        lines = frames + proc.stdout.read().splitlines()
        err = proc.stderr.read()
    assert proc.returncode == 128 + signum, err
    assert took < STOP_BOUND_S, f"stopped in {took:.2f} s"
    assert not any(mark in err for mark in CRASH_MARKS), err
    summary = json.loads(lines[-1])
    frame_lines = [json.loads(line) for line in lines[:-1] if line.strip()]
    assert summary["signal"] == signal.Signals(signum).name
    # Every frame that finished was emitted once; the ones in flight are counted.
    assert summary["summary"]["frames"] == len(frame_lines) >= 5
    assert summary["compile"]["device"] == "CPU"
    assert f"stopped by {signal.Signals(signum).name}" in err


def test_table_mode_prints_the_summary_table(stream: str, tmp_path: Path) -> None:
    args = ["--model", "person-ssdlite", "--source", stream]
    with spawn(args, tmp_path, subprocess.PIPE) as proc:
        assert proc.stderr is not None
        assert proc.stdout is not None
        assert "person-ssdlite runs on" in proc.stderr.readline()
        time.sleep(1.5)
        took = signal_and_time(proc, signal.SIGTERM)
        err = proc.stderr.read()
        out = proc.stdout.read()
    assert proc.returncode == 143, err
    assert took < STOP_BOUND_S, f"stopped in {took:.2f} s"
    assert not any(mark in err for mark in CRASH_MARKS), err
    assert "cli summary:" in err
    assert "end_to_end" in err
    assert out == ""  # tables never go to stdout


def test_live_table_on_a_terminal_survives_ctrl_c(stream: str, tmp_path: Path) -> None:
    """The case that aborted: the live table on a terminal, then Ctrl-C."""
    leader, follower = pty.openpty()
    proc = spawn(["--model", "person-ssdlite", "--source", stream], tmp_path, follower)
    os.close(follower)
    assert proc.stdout is not None
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:  # the process closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while b"stage" not in b"".join(chunks):  # the live table is drawn
        assert proc.poll() is None, b"".join(chunks)
        assert time.monotonic() < deadline, b"".join(chunks)
        time.sleep(0.1)
    time.sleep(1.0)
    took = signal_and_time(proc, signal.SIGINT)
    proc.stdout.close()
    reader.join(timeout=5)
    os.close(leader)
    err = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 130, err
    assert took < STOP_BOUND_S, f"stopped in {took:.2f} s"
    assert not any(mark in err for mark in CRASH_MARKS), err
    assert "cli summary:" in err
    assert "stopped by SIGINT" in err


@pytest.mark.parametrize("log_format", ["kv", "json"])
def test_verbose_shows_info_events_in_the_chosen_format(
    stream: str, tmp_path: Path, log_format: str
) -> None:
    args = ["--model", "person-ssdlite", "--source", stream, "--max-frames", "3", "--json"]
    quiet = spawn(args, tmp_path, subprocess.PIPE)
    loud = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "-v", "--log-format", log_format,
         "run-pipeline", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, EDGE_AGENT_STATE_DIR=str(tmp_path / "state")),
    )  # fmt: skip
    with quiet, loud:
        quiet_err = quiet.communicate(timeout=60)[1]
        loud_err = loud.communicate(timeout=60)[1]
    assert quiet.returncode == 0, quiet_err
    assert loud.returncode == 0, loud_err
    assert "source_live" not in quiet_err  # INFO is hidden without -v
    live = [ln for ln in loud_err.splitlines() if "source_live" in ln]
    assert len(live) == 1, loud_err
    if log_format == "json":
        assert json.loads(live[0])["event"] == "source_live"
    else:
        assert "event=source_live" in live[0]


def test_sigusr1_writes_every_threads_stack_and_the_run_goes_on(
    stream: str, tmp_path: Path
) -> None:
    # What an operator sends a process that looks stuck: it answers with where each
    # thread is, on stderr (the journal under systemd), and is not stopped by it.
    args = ["--model", "person-ssdlite", "--source", stream, "--json"]
    with spawn(args, tmp_path, subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        assert '"frame"' in proc.stdout.readline()
        proc.send_signal(signal.SIGUSR1)
        after = [proc.stdout.readline() for _ in range(5)]  # frames keep coming
        assert all('"frame"' in line for line in after), after
        signal_and_time(proc, signal.SIGINT)
        proc.stdout.read()
        err = proc.stderr.read()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "Current thread" in err or "Thread 0x" in err, err
    # Every thread, not just the main one: the pipeline's own are named in the stacks.
    assert err.count("Thread 0x") >= 3, err
    assert "edge_agent/pipelines/" in err, err
