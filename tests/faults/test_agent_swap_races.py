"""Swaps racing the other things a pipeline goes through: its run ending, other swaps.

Each race is made certain by holding one side at a seam (the record's write, the pool's
compile) until the other side has happened; the pool, the models, the MJPEG camera, the
store and the records are real.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.pipelines import Pipelines
from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.errors import EdgeAgentError
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from edge_agent.store.store import ModelStore
from tests.agent_kit import photo_pipelines
from tests.integration.store_kit import onnx_folder, release_for


def _until(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _on_camera(
    tmp_path: Path, cache_dir: Path, photo: npt.NDArray[np.uint8], camera: str
) -> tuple[Pipelines, dict[str, Any], list[AgentEvent | DetectionEvent]]:
    """Pipelines, and the spec of face-blazeface on a live camera: it runs until stopped."""
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, photo, events.append)
    return pipelines, {**spec, "source": {"type": "stream", "url": camera}}, events


def test_a_swap_whose_pipeline_ends_meanwhile_is_answered_not_a_crash(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # swap_model checked the pipeline's handle, recorded the new model, then used the
    # handle again: a run ending in between (a camera given up, a file played out) had
    # set it to None, and the command was answered `internal` (an AttributeError).
    pipelines, spec, _ = _on_camera(tmp_path, cache_dir, astronaut, camera)
    real_update = pipelines.records.update
    ended: list[bool] = []

    def update_as_the_run_ends(**changes: Any) -> Any:
        if not ended:
            ended.append(True)
            pipelines.handles()["cam"].stop()
            _until(lambda: pipelines.states()[0].status == "stopped", "the run's end")
        return real_update(**changes)

    try:
        pipelines.start(spec)
        monkeypatch.setattr(pipelines.records, "update", update_as_the_run_ends)
        state = pipelines.swap("cam", {"name": "text-orientation"})
        assert ended, "the seam was never reached"
        assert state.status == "stopped"
        # The swap that came too late gave its model back: nothing is left loaded.
        _until(lambda: not [t for t in threading.enumerate() if t.name == "swap-cam"], "swap")
        assert len(pipelines.pool) == 0
    finally:
        pipelines.close()


class _HeldCompiles:
    """The real pool's compiles on swap threads, held at `gate` for the names or paths in
    `slow` (a first compile on a GPU takes a minute) and failed, once let through, for the
    names in `failing`: a fault injected where a real one cannot be timed."""

    def __init__(
        self,
        pipelines: Pipelines,
        monkeypatch: pytest.MonkeyPatch,
        slow: str,
        failing: tuple[str, ...] = (),
    ) -> None:
        self.entered, self.gate = threading.Event(), threading.Event()
        real = pipelines.pool.acquire

        def acquire(model: str, backend: str, options: Any) -> Any:
            if not threading.current_thread().name.startswith("swap-"):
                return real(model, backend, options)
            if model in failing and model != slow:
                raise EdgeAgentError(f"{model} does not compile", code="device.unavailable")
            compiled, resolved = real(model, backend, options)
            if slow in (model, resolved.path.parent.name):
                self.entered.set()
                assert self.gate.wait(30), "the test never opened the gate"
                if model in failing:
                    pipelines.pool.release(compiled)
                    raise EdgeAgentError(f"{model} does not compile", code="device.unavailable")
            return compiled, resolved

        monkeypatch.setattr(pipelines.pool, "acquire", acquire)


def _face_versions(pipelines: Pipelines, tmp_path: Path, cache_dir: Path) -> ModelStore:
    """Versions 1 (active) and 2 of a model "face" in the pipelines' store: face-blazeface
    both, in files of their own, so the pool compiles each on its own."""
    store = pipelines.pool.catalog.store
    assert isinstance(store, ModelStore)
    reference = Catalog(default_models_dir(), cache_dir).resolve("face-blazeface")
    for version in (1, 2):
        folder = onnx_folder(reference, tmp_path / f"v{version}")
        store.install(release_for("face", version, folder, reference.manifest, None), folder)
    store.activate("face", 1)
    return store


def _loaded_version(pipelines: Pipelines) -> str:
    """The store version of the one model loaded: the pool keys by file, versions/<v>/."""
    [(path, _, _)] = list(pipelines.pool._entries)
    return Path(path).parent.name


def _swaps_left() -> int:
    return len([t for t in threading.enumerate() if t.name == "swap-cam" and t.is_alive()])


def _settled(pipelines: Pipelines) -> None:
    """Every swap thread done, and the pipeline down to the one model it runs (a model
    swapped out goes back to the pool once its last frame is out)."""
    _until(lambda: _swaps_left() == 0, "the swaps")
    _until(lambda: len(pipelines.pool) == 1, "one model loaded")


@pytest.mark.parametrize(
    ("failing", "runs"),
    [
        ((), "person-ssdlite"),
        (("text-orientation",), "person-ssdlite"),
        (("person-ssdlite",), "face-blazeface"),
    ],
    ids=["first-slow", "first-fails-late", "second-fails"],
)
def test_two_swaps_land_in_the_order_they_were_asked(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: str,
    monkeypatch: pytest.MonkeyPatch,
    failing: tuple[str, ...],
    runs: str,
) -> None:
    # swap_model to text-orientation (slow to compile), then to person-ssdlite: the
    # first landed last, over the second, while the record and list_pipelines said
    # person-ssdlite; failing late, it put face-blazeface back into the record while
    # person-ssdlite ran. The later swap wins; failing, the first (superseded) one is
    # not run either, and the record and the event name what does run.
    pipelines, spec, events = _on_camera(tmp_path, cache_dir, astronaut, camera)
    try:
        pipelines.start(spec)
        compiles = _HeldCompiles(pipelines, monkeypatch, "text-orientation", failing)
        pipelines.swap("cam", {"name": "text-orientation"})
        assert compiles.entered.wait(30)
        pipelines.swap("cam", {"name": "person-ssdlite"})
        _until(lambda: _swaps_left() == 1, "the second swap")
        compiles.gate.set()
        _settled(pipelines)

        assert pipelines.records.record.pipelines["cam"]["model"]["name"] == runs
        assert [s.model for s in pipelines.states()] == [runs]
        assert list(pipelines.pool.reports()) == [runs]
        assert pipelines.handles()["cam"].ref.name == runs
        failed = [e.detail for e in events if e.kind == "pipeline_failed"]
        if "person-ssdlite" in failing:
            assert len(failed) == 1, failed
            assert "still running face-blazeface" in failed[0]
        else:
            assert failed == []  # a superseded swap's failure decides nothing
    finally:
        pipelines.close()


def test_a_rollback_during_the_deploys_swap_is_what_runs(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A deploy activates face v2 and swaps its pipeline to it, a first compile (slow);
    # a rollback to v1 then swaps again, from the compile already held (at once). v2
    # landed after it: the store said v1 and the pipeline ran v2, for good.
    pipelines, spec, _ = _on_camera(tmp_path, cache_dir, astronaut, camera)
    store = _face_versions(pipelines, tmp_path, cache_dir)
    try:
        pipelines.start({**spec, "model": {"name": "face"}})
        compiles = _HeldCompiles(pipelines, monkeypatch, "2")  # the folder versions/2
        store.activate("face", 2)
        assert pipelines.reload_model("face") == ["cam"]
        assert compiles.entered.wait(30)
        assert store.rollback("face") == 1
        assert pipelines.reload_model("face") == ["cam"]
        _until(lambda: _swaps_left() == 1, "the rollback's swap")
        compiles.gate.set()
        _settled(pipelines)

        assert _loaded_version(pipelines) == "1"
        assert store.state("face").current == 1
    finally:
        pipelines.close()


def test_a_deploy_during_a_start_swaps_the_pipeline_once_it_runs(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # start_pipeline resolved face to v1 and compiled it; a deploy activated v2 during
    # that compile, and its reload_model skipped the pipeline, which had no handle yet:
    # the store said v2 and the pipeline ran v1 until it was restarted.
    pipelines, spec, _ = _on_camera(tmp_path, cache_dir, astronaut, camera)
    store = _face_versions(pipelines, tmp_path, cache_dir)
    compiling, gate = threading.Event(), threading.Event()
    real = pipelines.pool.acquire

    def acquire(model: str, backend: str, options: Any) -> Any:
        compiled, resolved = real(model, backend, options)
        if threading.current_thread().name == "starter":
            compiling.set()
            assert gate.wait(30), "the test never opened the gate"
        return compiled, resolved

    monkeypatch.setattr(pipelines.pool, "acquire", acquire)
    starter = threading.Thread(
        target=pipelines.start, args=({**spec, "model": {"name": "face"}},), name="starter"
    )
    try:
        starter.start()
        assert compiling.wait(30)
        store.activate("face", 2)
        swapped = pipelines.reload_model("face")
        gate.set()
        starter.join(30)
        assert [s.status for s in pipelines.states()] == ["running"]
        _settled(pipelines)
        assert _loaded_version(pipelines) == "2"
        assert swapped == ["cam"]  # the deploy's answer names it among those swapped
    finally:
        gate.set()
        pipelines.close()
