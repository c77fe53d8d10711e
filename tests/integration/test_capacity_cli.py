"""`edge-agent run-pipeline A B ...`: several pipelines in one process, from the command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.clips import write_walk


def write_spec(path: Path, pipeline: str, video: Path, source_extra: str = "") -> Path:
    path.write_text(
        f'id = "{pipeline}"\nsinks = []\n[model]\nname = "person-ssdlite"\n'
        f'[source]\ntype = "file"\npath = "{video}"\n{source_extra}'
    )
    return path


def run_cli(args: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, EDGE_AGENT_STATE_DIR=str(tmp_path / "state"))
    return subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "run-pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def video(
    tmp_path_factory: pytest.TempPathFactory, resolve: Callable[[str], ResolvedModel]
) -> Path:
    resolve("person-ssdlite")  # fetched before the subprocess needs it
    return write_walk(tmp_path_factory.mktemp("video") / "walk.avi", empty=2, crossing=4).path


def test_two_specs_run_in_one_process_with_a_summary_line_each(video: Path, tmp_path: Path) -> None:
    a = write_spec(tmp_path / "a.toml", "door", video)
    b = write_spec(tmp_path / "b.toml", "yard", video)
    with run_cli([str(a), str(b), "--json"], tmp_path) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    frames = [line for line in lines if "frame" in line]
    summaries = [line for line in lines if "summary" in line]
    assert [s["summary"]["pipeline"] for s in summaries] == ["door", "yard"]
    assert lines[-2:] == summaries, "the summaries come last, one line per pipeline"
    for name in ("door", "yard"):
        assert [f["frame"] for f in frames if f["pipeline"] == name] == list(range(12))
    for summary in summaries:
        assert summary["summary"]["frames"] == 12
        assert summary["source"]["type"] == "file"
        assert summary["compile"]["device"] == "CPU"
    # The start line names each pipeline, so two on one screen can be told apart.
    assert "door: person-ssdlite runs on" in err
    assert "yard: person-ssdlite runs on" in err


def test_a_signal_stops_every_pipeline_and_prints_every_summary(
    video: Path, tmp_path: Path
) -> None:
    looped = "realtime = true\nloop = true\n"
    specs = [write_spec(tmp_path / f"{n}.toml", n, video, looped) for n in ("c1", "c2", "c3")]
    with run_cli([*map(str, specs), "--json"], tmp_path) as proc:
        assert proc.stdout is not None
        seen = {json.loads(proc.stdout.readline())["pipeline"] for _ in range(30)}
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    assert seen == {"c1", "c2", "c3"}, "every pipeline runs at once"
    assert proc.returncode == 130, err
    assert took < 3.0, f"stopped in {took:.2f} s"
    summaries = [json.loads(line) for line in out.splitlines() if '"summary"' in line]
    assert [s["summary"]["pipeline"] for s in summaries] == ["c1", "c2", "c3"]
    assert all(s["signal"] == "SIGINT" for s in summaries)
    assert all(s["source"]["played"] >= s["summary"]["frames"] > 0 for s in summaries)


def test_two_specs_with_one_id_are_refused(video: Path, tmp_path: Path) -> None:
    a = write_spec(tmp_path / "a.toml", "same", video)
    b = write_spec(tmp_path / "b.toml", "same", video)
    with run_cli([str(a), str(b)], tmp_path) as proc:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "pipeline id same is used by more than one spec" in err
    assert "Traceback" not in err
