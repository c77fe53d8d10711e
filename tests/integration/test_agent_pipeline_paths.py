"""A pipeline may not name a path inside the agent's own folders.

A start_pipeline could name its sinks and sources anywhere. A jsonl sink in a store
version folder made the store take that version for corrupt, so every pipeline on it
failed, across restarts; the file was made even when the start then failed, since sinks
were opened before the model was looked up. A snapshot sink deletes the oldest JPEGs of
whatever folder it is given. Such a start is now answered command.invalid, naming the
field, before anything is made, whatever the spelling (a symlink, '..'), and a record
holding one does not bring it back, but lists it failed until a stop_pipeline forgets it;
a start refused for its model or its source makes no sink file either. A real agent (on a
thread) over a real mosquitto; the store's model is text-orientation, published as
`orient` by the `fleet` fixture.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.records import AgentRecords
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.errors import EdgeAgentError
from edge_agent.store.release import generate_key, save_public_key
from tests.agent_kit import InProcessAgent, Watcher, photo_pipelines, write_config
from tests.broker import Fleet
from tests.cli_kit import edge_agent_cli, one_line_error

DEVICE = "paths-dev"
MISSING = "no-such-model"
"""The model of the refused starts: a refusal must come before the model is looked up
(and no model need be fetched into their cache of their own)."""


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


@pytest.fixture
def photos(tmp_path: Path, astronaut: npt.NDArray[np.uint8]) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.jpg"), astronaut)
    return folder


def _agent(broker: LocalBroker, tmp_path: Path, **config: Any) -> InProcessAgent:
    """An agent with its state in `tmp_path`; `config` as `write_config` takes it."""
    path = tmp_path / "agent.toml"
    write_config(path, port=broker.port, device=DEVICE, state=tmp_path / "state", **config)
    return InProcessAgent(path)


def _refused(watcher: Watcher, spec: dict[str, Any]) -> dict[str, Any]:
    answer = watcher.final(watcher.send("start_pipeline", {"spec": spec}), timeout=60)
    assert answer["status"] == "error", answer
    error: dict[str, Any] = answer["error"]
    return error


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder below `folder`, with the files' bytes (sqlite's excepted:
    the agent writes those all the time)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() or ".sqlite" in p.name else p.read_bytes()
        for p in folder.rglob("*")
    }


def test_a_sink_in_a_store_version_is_refused_and_the_version_serves_on(
    broker: LocalBroker, fleet: Fleet, tmp_path: Path, watcher: Watcher, photos: Path
) -> None:
    public = tmp_path / "fleet.pub"
    save_public_key(fleet.key.public_key(), public)
    state = tmp_path / "state"
    agent = _agent(broker, tmp_path, results="all", trusted_keys=[public])
    try:
        watcher.wait_state(lambda s: s["online"])
        deployed = watcher.final(watcher.send("deploy_model", {"name": "orient"}), timeout=90)
        assert deployed["status"] == "ok", deployed
        version = state / "store" / "models" / "orient" / "versions" / "1"
        before = sorted(p.name for p in version.iterdir())
        spec: dict[str, Any] = {
            "id": "scans",
            "model": {"name": "orient"},
            "source": {"type": "folder", "path": str(photos)},
            "sinks": [{"type": "jsonl", "path": str(version / "r.jsonl")}],
        }
        error = _refused(watcher, spec)
        assert sorted(p.name for p in version.iterdir()) == before
        assert error["code"] == "command.invalid", error
        assert error.get("field") == "args.spec.sinks.0.path", error
        assert f"inside {state / 'store'}" in error["message"], error

        # The version is whole: a pipeline on it runs, with its sink where the state folder
        # has room for a user's files (beside the agent's own parts, not inside them).
        spec["sinks"] = [{"type": "jsonl", "path": str(state / "scans.jsonl")}]
        assert watcher.ok("start_pipeline", {"spec": spec}, timeout=60)["status"] == "running"
        watcher.wait_event(
            lambda e: e["kind"] == "pipeline_stopped" and e["pipeline"] == "scans", timeout=60
        )
        lines = (state / "scans.jsonl").read_text().splitlines()
        assert [json.loads(line)["frame"] for line in lines] == [0, 1, 2]
    finally:
        agent.close()


def _snapshot_in_a_store_version(tmp: Path) -> tuple[dict[str, Any], str]:
    folder = tmp / "state" / "store" / "models" / "orient" / "versions" / "1"
    return {"sinks": [{"type": "snapshot", "folder": str(folder)}]}, "sinks.1.folder"


def _jsonl_in_the_records_through_a_symlink(tmp: Path) -> tuple[dict[str, Any], str]:
    (tmp / "results").symlink_to(tmp / "state" / "agent", target_is_directory=True)
    return {"sinks": [{"type": "jsonl", "path": str(tmp / "results" / "r.jsonl")}]}, (
        "sinks.1.path"
    )


def _capture_in_the_transfers_through_dotdot(tmp: Path) -> tuple[dict[str, Any], str]:
    folder = tmp / "elsewhere" / ".." / "state" / "transfers" / "frames"
    return {"sinks": [{"type": "capture", "folder": str(folder)}]}, "sinks.1.folder"


def _jsonl_on_the_outbox_log(tmp: Path) -> tuple[dict[str, Any], str]:
    return {"sinks": [{"type": "jsonl", "path": str(tmp / "state" / "outbox.sqlite-wal")}]}, (
        "sinks.1.path"
    )


def _jsonl_in_the_compile_cache(tmp: Path) -> tuple[dict[str, Any], str]:
    (tmp / "cache" / "compiled").mkdir(parents=True)
    return {"sinks": [{"type": "jsonl", "path": str(tmp / "cache" / "compiled" / "r.jsonl")}]}, (
        "sinks.1.path"
    )


def _jsonl_on_a_trusted_key(tmp: Path) -> tuple[dict[str, Any], str]:
    return {"sinks": [{"type": "jsonl", "path": str(tmp / "fleet.pub")}]}, "sinks.1.path"


def _folder_source_in_the_records(tmp: Path) -> tuple[dict[str, Any], str]:
    return {"source": {"type": "folder", "path": str(tmp / "state" / "agent")}}, "source.path"


def _folder_source_reaching_down_into_the_state(tmp: Path) -> tuple[dict[str, Any], str]:
    return {"source": {"type": "folder", "path": str(tmp), "pattern": "**/*.json"}}, (
        "source.pattern"
    )


def _folder_source_matching_the_outbox_beside_it(tmp: Path) -> tuple[dict[str, Any], str]:
    source = {"type": "folder", "path": str(tmp / "state"), "pattern": "outbox.sqlite*"}
    return {"source": source}, "source.pattern"


def _folder_source_climbing_out(tmp: Path) -> tuple[dict[str, Any], str]:
    source = {"type": "folder", "path": str(tmp / "photos"), "pattern": "../state/agent/*"}
    return {"source": source}, "source.pattern"


@pytest.mark.parametrize(
    "case",
    [
        _snapshot_in_a_store_version,
        _jsonl_in_the_records_through_a_symlink,
        _capture_in_the_transfers_through_dotdot,
        _jsonl_on_the_outbox_log,
        _jsonl_in_the_compile_cache,
        _jsonl_on_a_trusted_key,
        _folder_source_in_the_records,
        _folder_source_reaching_down_into_the_state,
        _folder_source_matching_the_outbox_beside_it,
        _folder_source_climbing_out,
    ],
    ids=lambda case: case.__name__.strip("_"),
)
def test_a_path_in_the_agents_own_folders_is_refused_before_anything_is_made(
    broker: LocalBroker,
    tmp_path: Path,
    watcher: Watcher,
    photos: Path,
    case: Callable[[Path], tuple[dict[str, Any], str]],
) -> None:
    key = tmp_path / "fleet.pub"
    save_public_key(generate_key().public_key(), key)
    agent = _agent(broker, tmp_path, cache=tmp_path / "cache", trusted_keys=[key])
    try:
        watcher.wait_state(lambda s: s["online"])
        watcher.ok("ping")  # the command log is made: what follows must change nothing
        changes, field = case(tmp_path)
        before = _tree(tmp_path)
        spec = {
            "id": "cam",
            "model": {"name": MISSING},
            "source": changes.get("source", {"type": "folder", "path": str(photos)}),
            # A sink that may be comes first: a refused start makes none of its files either.
            "sinks": [
                {"type": "jsonl", "path": str(tmp_path / "state" / "ok.jsonl")},
                *changes.get("sinks", []),
            ],
        }
        error = _refused(watcher, spec)
        assert _tree(tmp_path) == before
        assert error["code"] == "command.invalid", error
        assert error.get("field") == f"args.spec.{field}", error
        assert watcher.ok("list_pipelines") == {"pipelines": []}
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("model", "source", "code"),
    [
        (MISSING, None, "model.not_found"),
        ("face-blazeface", {"type": "file", "path": "gone.mp4"}, "source.unreachable"),
        ("face-blazeface", {"type": "wav", "path": "speech.wav"}, "model.incompatible"),
    ],
    ids=["missing-model", "missing-video", "audio-for-an-image-model"],
)
def test_a_start_refused_for_its_model_or_source_makes_no_sink_file(
    broker: LocalBroker,
    tmp_path: Path,
    watcher: Watcher,
    photos: Path,
    model: str,
    source: dict[str, str] | None,
    code: str,
) -> None:
    # Sinks were opened first: every refused start left its files and folders behind.
    agent = _agent(broker, tmp_path)
    try:
        watcher.wait_state(lambda s: s["online"])
        if source is not None:
            source = {**source, "path": str(tmp_path / source["path"])}
        out = tmp_path / "state" / "out"
        sinks: list[dict[str, str]] = [
            {"type": "jsonl", "path": str(out / "r.jsonl")},
            {"type": "snapshot", "folder": str(out / "snapshots")},
        ]
        if source is None or source["type"] != "wav":  # on audio, a spec error of its own
            sinks.append({"type": "capture", "folder": str(out / "frames")})
        spec = {
            "id": "cam",
            "model": {"name": model},
            "source": source or {"type": "folder", "path": str(photos)},
            "sinks": sinks,
        }
        out.mkdir()
        assert _refused(watcher, spec)["code"] == code
        assert list(out.iterdir()) == []
    finally:
        agent.close()


def test_a_sink_outside_the_state_folder_is_refused_and_the_files_there_are_untouched(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, photos: Path
) -> None:
    # Outside systemd's sandbox, a jsonl sink's cap renamed a user's .bashrc over .bashrc.1
    # and wrote JSON lines in its place: a command may write only in the state folder.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export IMPORTANT=1\n")
    (home / ".bashrc.1").write_text("an older copy the user kept\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "home").symlink_to(home, target_is_directory=True)
    before = _tree(home)
    agent = _agent(broker, tmp_path)
    try:
        watcher.wait_state(lambda s: s["online"])
        sinks = [
            ({"type": "jsonl", "path": str(home / ".bashrc"), "max_mb": 1e-6}, "path"),
            ({"type": "jsonl", "path": "../home/.bashrc", "max_mb": 1e-6}, "path"),
            ({"type": "jsonl", "path": "home/.bashrc", "max_mb": 1e-6}, "path"),  # the link
            ({"type": "snapshot", "folder": str(state / "home")}, "folder"),
            ({"type": "capture", "folder": str(home)}, "folder"),
        ]
        for sink, key in sinks:
            spec = {
                "id": "w",
                "model": {"name": MISSING},
                "source": {"type": "folder", "path": str(photos)},
                "sinks": [sink],
            }
            error = _refused(watcher, spec)
            assert error["code"] == "command.invalid", (sink, error)
            assert error.get("field") == f"args.spec.sinks.0.{key}", (sink, error)
            assert f"outside {state}, the agent's state folder" in error["message"], error
        assert _tree(home) == before
        assert watcher.ok("list_pipelines") == {"pipelines": []}
    finally:
        agent.close()


def test_a_relative_sink_path_is_taken_inside_the_state_folder_and_recorded_so(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, photos: Path
) -> None:
    state = tmp_path / "state"
    agent = _agent(broker, tmp_path)
    try:
        watcher.wait_state(lambda s: s["online"])
        spec = {
            "id": "scans",
            "model": {"name": "text-orientation"},
            "source": {"type": "folder", "path": str(photos)},
            "sinks": [{"type": "jsonl", "path": "scans.jsonl"}],
        }
        assert watcher.ok("start_pipeline", {"spec": spec}, timeout=60)["status"] == "running"
        watcher.wait_event(
            lambda e: e["kind"] == "pipeline_stopped" and e["pipeline"] == "scans", timeout=60
        )
        lines = (state / "scans.jsonl").read_text().splitlines()
        assert [json.loads(line)["frame"] for line in lines] == [0, 1, 2]
        # A restore opens the same file, whatever its working folder is then.
        recorded = AgentRecords(state / "agent").record.pipelines["scans"]
        assert recorded["sinks"][0]["path"] == str(state / "scans.jsonl")
    finally:
        agent.close()


def test_a_recorded_pipeline_with_a_sink_in_the_store_is_not_restored_but_listed_failed(
    broker: LocalBroker,
    tmp_path: Path,
    watcher: Watcher,
    photos: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What an agent of before this check may have recorded. It was refused with an event
    # and a log line only: no list_pipelines and no retained state showed it again.
    store = tmp_path / "state" / "store"
    spec = {
        "id": "cam",
        "model": {"name": MISSING},
        "source": {"type": "folder", "path": str(photos)},
        "sinks": [{"type": "snapshot", "folder": str(store / "models" / "orient")}],
    }
    AgentRecords(tmp_path / "state" / "agent").update(pipelines={"cam": spec})
    caplog.set_level(logging.INFO, logger="edge_agent.agent")
    agent = _agent(broker, tmp_path, cache=tmp_path / "cache")
    try:
        watcher.wait_state(lambda s: s["online"])
        event = watcher.wait_event(lambda e: e["pipeline"] == "cam")
        assert (event["kind"], event["code"]) == ("pipeline_failed", "command.invalid"), event
        failed = [
            vars(r)["fields"] for r in caplog.records if r.getMessage() == "pipeline_restore_failed"
        ]
        assert [(f["pipeline"], f["code"]) for f in failed] == [("cam", "command.invalid")]
        assert not store.exists()
        [listed] = watcher.ok("list_pipelines")["pipelines"]
        assert (listed["id"], listed["model"], listed["status"]) == ("cam", MISSING, "failed")
        assert listed["detail"].startswith("not started from its record (command.invalid): ")
        assert watcher.wait_state(lambda s: bool(s["pipelines"]))["pipelines"] == [listed]
        assert list(AgentRecords(tmp_path / "state" / "agent").record.pipelines) == ["cam"]
        # Not running, but recorded: stop_pipeline forgets it (it was not found, and so
        # tried and refused at every start for good).
        stopped = watcher.ok("stop_pipeline", {"id": "cam"})
        assert (stopped["id"], stopped["status"]) == ("cam", "stopped")
        assert AgentRecords(tmp_path / "state" / "agent").record.pipelines == {}
        assert watcher.ok("list_pipelines") == {"pipelines": []}
    finally:
        agent.close()


def test_a_recorded_sink_outside_the_state_folder_is_listed_failed_until_stopped(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # What a build before the state-folder rule recorded: after the upgrade its restore
    # is refused, and the pipeline must stay in sight (and in the record) until someone
    # stops it, rather than stop coming back unseen.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    outside = tmp_path / "home" / "dock.jsonl"
    old = {**spec, "id": "dock", "sinks": [{"type": "jsonl", "path": str(outside)}]}
    pipelines.records.update(pipelines={"dock": old, "cam": spec})
    try:
        assert pipelines.restore() == ["cam"]
        [listed] = [s for s in pipelines.states() if s.id == "dock"]
        assert (listed.model, listed.status) == ("face-blazeface", "failed")
        assert listed.detail.startswith("not started from its record (command.invalid): ")
        assert f"outside {tmp_path / 'state'}, the agent's state folder" in listed.detail
        assert list(pipelines.records.record.pipelines) == ["dock", "cam"]
        # Its id is taken until it is stopped, as a running one's is.
        with pytest.raises(EdgeAgentError) as taken:
            pipelines.start({**old, "sinks": []})
        assert taken.value.code == "pipeline.exists"

        assert pipelines.stop("dock").status == "stopped"
        assert [s.id for s in pipelines.states()] == ["cam"]
        assert list(pipelines.records.record.pipelines) == ["cam"]
        # The way back: started again with its sink in the state folder.
        mended = {**old, "sinks": [{"type": "jsonl", "path": "dock.jsonl"}]}
        assert pipelines.start(mended).status == "running"
        assert not outside.parent.exists()
    finally:
        pipelines.close()


def test_a_recorded_snapshot_kind_that_never_took_one_is_dropped_not_the_camera(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # Builds before the check accepted snapshot kinds that come between frames; they never
    # took a snapshot. Refused at restore, they kept the whole camera from coming back
    # after the upgrade; a new start_pipeline with them is still refused.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    sink = {"type": "snapshot", "folder": "snaps", "kinds": ["appeared", "source_error"]}
    # And a mask drawn in fractions without units: 1 px across, it let the camera detect
    # as if there were none. Kept as it served, and said.
    mask = {"points": [[0.0, 0.0], [0.5, 0.0], [0.5, 0.5]]}
    old = {**spec, "id": "dock", "sinks": [sink], "masks": [mask]}
    # With a field a newer build wrote, as after a downgrade: dropped as well.
    pipelines.records.update(pipelines={"dock": {**old, "from_a_newer_build": True}})
    try:
        assert pipelines.restore() == ["dock"]
        with pytest.raises(EdgeAgentError) as refused:
            pipelines.start({**old, "id": "dock-3", "sinks": []})
        assert 'units = "fraction"' in str(refused.value)
        with pytest.raises(EdgeAgentError) as refused:
            pipelines.start({**old, "id": "dock-2", "masks": []})
        assert refused.value.code == "command.invalid"
        assert "carry no image" in str(refused.value)
    finally:
        pipelines.close()
    assert list(pipelines.records.record.pipelines) == ["dock"]


def test_calibration_data_in_the_agents_own_files_is_refused_before_anything_is_read(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher
) -> None:
    # A start_pipeline source there was refused; calibrate's data was read all the same
    # (the MQTT password file, TLS keys: whatever the config names).
    key = tmp_path / "fleet.pub"
    save_public_key(generate_key().public_key(), key)
    (tmp_path / "linked.pub").symlink_to(key)
    agent = _agent(broker, tmp_path, cache=tmp_path / "cache", trusted_keys=[key])
    try:
        watcher.wait_state(lambda s: s["online"])
        for data in (
            key,
            tmp_path / "linked.pub",
            tmp_path / "agent.toml",  # the config: it names where the secrets are
            tmp_path / "state" / "agent",
            tmp_path / "cache",
        ):
            answer = watcher.final(
                watcher.send("calibrate", {"model": MISSING, "data": str(data)}), timeout=60
            )
            assert answer["status"] == "error", answer
            error = answer["error"]
            assert (error["code"], error.get("field")) == ("command.invalid", "args.data"), error
            assert "which edge-agent keeps its own data in" in error["message"], error
        # A pipeline's captures lie in the state's own parts, and are what calibrate is for.
        answer = watcher.final(
            watcher.send("calibrate", {"model": MISSING, "data": "pipeline:cam"}), timeout=60
        )
        assert answer["error"]["code"] == "model.not_found", answer
    finally:
        agent.close()


def test_calibrate_on_a_pipeline_reads_the_capture_folder_the_agent_recorded_for_it(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, photos: Path
) -> None:
    # `pipeline:<id>` is the folder the pipeline's capture sink names in the agent's
    # record, not the default captures folder of that id.
    agent = _agent(broker, tmp_path, cache=tmp_path / "cache")
    state = tmp_path / "state"
    try:
        watcher.wait_state(lambda s: s["online"])
        spec = {
            "id": "dock",
            "model": {"name": "text-orientation"},
            "source": {"type": "folder", "path": str(photos)},
            "sinks": [{"type": "capture", "folder": "dock-frames", "min_interval_s": 3600}],
        }
        watcher.ok("start_pipeline", {"spec": spec}, timeout=60)
        watcher.wait_event(
            lambda e: e["kind"] == "pipeline_stopped" and e["pipeline"] == "dock", timeout=60
        )
        assert any((state / "dock-frames").iterdir())
        assert not (state / "captures" / "dock").exists()
        answer = watcher.final(
            watcher.send("calibrate", {"model": "text-orientation", "data": "pipeline:dock"}),
            timeout=60,
        )
        # Its frames were read: too few of them for the gate, rather than none found in the
        # default captures folder.
        assert answer["status"] == "error", answer
        assert "held-out frames" in answer["error"]["message"], answer
    finally:
        agent.close()


def test_the_local_cli_refuses_a_sink_in_its_store_too(tmp_path: Path) -> None:
    state = tmp_path / "state"
    folder = state / "store" / "models" / "orient" / "versions" / "1"
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'id = "scans"\n[model]\nname = "text-orientation"\n'
        f'[source]\ntype = "folder"\npath = "{tmp_path}"\n'
        f'[[sinks]]\ntype = "snapshot"\nfolder = "{folder}"\n'
    )
    proc = edge_agent_cli("--state-dir", str(state), "run-pipeline", str(spec))
    assert one_line_error(proc, "sinks.0.folder", "keeps its own data") == "config.invalid"
    assert not state.exists()
