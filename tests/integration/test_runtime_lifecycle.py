"""A compiled model's life: close, context manager, the pool closing it, no leftovers."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.bench import bench_inputs
from edge_agent.catalog.catalog import Catalog, ResolvedModel
from edge_agent.errors import EdgeAgentError
from edge_agent.runtime import cache, create_backend
from edge_agent.runtime.base import CompiledModel, RuntimeOptions, Tensors
from edge_agent.runtime.pool import ModelPool

BACKENDS = ["openvino", "onnxruntime"]
Resolve = Callable[[str], ResolvedModel]
VAD = "vad-silero"  # tiny and fast on both engines


def _compile(resolve: Resolve, backend: str, cache: Path | None, **kw: object) -> CompiledModel:
    resolved = resolve(VAD)
    options = RuntimeOptions.model_validate({"cache_dir": cache, **kw})
    return create_backend(backend).compile(resolved.path, resolved.manifest, options)


def _feeds(model: CompiledModel) -> dict[str, npt.NDArray[np.float32]]:
    return {n: np.zeros(s, dtype=np.float32) for n, s in model.report.inputs.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_is_final_and_idempotent(resolve: Resolve, cache_dir: Path, backend: str) -> None:
    model = _compile(resolve, backend, cache_dir)
    feeds = _feeds(model)
    assert "output" in model.infer(feeds)
    model.close()
    model.close()  # a second close is harmless
    with pytest.raises(EdgeAgentError, match="closed") as info:
        model.infer(feeds)
    assert info.value.code == "inference.failed"
    with pytest.raises(EdgeAgentError, match="closed"):
        model.submit(feeds, lambda *_: None, None)
    model.wait()  # nothing in flight: returns at once


@pytest.mark.parametrize("backend", BACKENDS)
def test_context_manager_closes(resolve: Resolve, cache_dir: Path, backend: str) -> None:
    with _compile(resolve, backend, cache_dir) as model:
        feeds = _feeds(model)
        model.infer(feeds)
    with pytest.raises(EdgeAgentError, match="closed"):
        model.infer(feeds)


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_waits_for_runs_in_flight(resolve: Resolve, cache_dir: Path, backend: str) -> None:
    model = _compile(resolve, backend, cache_dir, hint="throughput")
    feeds = _feeds(model)
    called: list[int] = []
    lock = threading.Lock()

    def done(outputs: Tensors, index: object, latency: float) -> None:
        with lock:
            called.append(int(index))  # type: ignore[call-overload]

    for i in range(40):
        model.submit(feeds, done, i)
    model.close()
    assert sorted(called) == list(range(40)), "every submitted run called back before close"


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_waits_for_a_synchronous_run_on_another_thread(
    resolve: Resolve, cache_dir: Path, backend: str
) -> None:
    model = _compile(resolve, backend, cache_dir)
    feeds = _feeds(model)
    finished = 0
    errors: list[BaseException] = []

    def infers() -> None:
        nonlocal finished
        try:
            while True:
                model.infer(feeds)
                finished += 1
        except EdgeAgentError as exc:
            errors.append(exc)

    worker = threading.Thread(target=infers)
    worker.start()
    while finished < 5:
        threading.Event().wait(0.001)
    model.close()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], EdgeAgentError)
    assert errors[0].code == "inference.failed"


def test_a_failing_callback_is_raised_by_wait(resolve: Resolve, cache_dir: Path) -> None:
    for backend in BACKENDS:
        with _compile(resolve, backend, cache_dir) as model:

            def done(outputs: Tensors, userdata: object, latency: float) -> None:
                raise ValueError("sink broke")

            model.submit(_feeds(model), done, None)
            with pytest.raises(ValueError, match="sink broke"):
                model.wait()
            model.wait()  # raised once, then forgotten


def test_pool_closes_a_model_when_its_last_user_lets_go(catalog: Catalog) -> None:
    pool = ModelPool(catalog)
    options = RuntimeOptions(cache_dir=catalog.cache)
    first, _ = pool.acquire(VAD, "onnxruntime", options)
    second, _ = pool.acquire(VAD, "onnxruntime", options)
    assert first is second, "one compiled model for both users"
    feeds = _feeds(first)
    pool.release(first)
    assert "output" in second.infer(feeds), "still open while a user holds it"
    assert len(pool) == 1
    pool.release(second)
    assert len(pool) == 0
    with pytest.raises(EdgeAgentError, match="closed"):
        second.infer(feeds)
    third, _ = pool.acquire(VAD, "onnxruntime", options)
    assert third is not first, "a fresh model after the old one closed"
    assert "output" in third.infer(feeds)
    pool.release(third)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The process's temporary folder, private to this test (others share /tmp)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("name", [VAD, "text-orientation"])
def test_no_cache_compile_leaves_no_temporary_files(
    resolve: Resolve, private_tmp: Path, name: str
) -> None:
    assert tempfile.gettempdir() == str(private_tmp)
    before = set(private_tmp.iterdir())
    resolved = resolve(name)
    model = create_backend("openvino").compile(
        resolved.path, resolved.manifest, RuntimeOptions(cache_dir=None)
    )
    with model:
        assert not model.report.from_cache
        model.infer(bench_inputs(resolved.manifest, model.report))
    assert set(private_tmp.iterdir()) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_from_inside_done_does_not_wait_for_itself(
    resolve: Resolve, cache_dir: Path, backend: str
) -> None:
    model = _compile(resolve, backend, cache_dir)
    feeds = _feeds(model)
    returned = threading.Event()

    def done(outputs: Tensors, userdata: object, latency: float) -> None:
        model.close()  # the last user letting go on its last result
        returned.set()

    model.submit(feeds, done, None)
    assert returned.wait(10), "close() inside done() returned"
    model.wait()

    def infer_until_closed() -> None:
        for _ in range(100):  # the close finishes in the background
            model.infer(feeds)
            threading.Event().wait(0.01)

    with pytest.raises(EdgeAgentError, match="closed"):
        infer_until_closed()


def test_the_compile_cache_is_cut_back_and_a_hit_counts_as_use(
    resolve: Resolve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every version a box ever ran left its IR and blobs in the cache for good. After each
    # compile the cache is now cut back under its cap, least recently used first; a model
    # compiled from files deleted since goes on running, and compiling again rebuilds them.
    model = _compile(resolve, "openvino", tmp_path)
    try:
        (xml,) = (tmp_path / "ir").glob("*.xml")
        assert list((tmp_path / "compiled").iterdir()), "OpenVINO wrote no blob"
        # Under the default cap nothing goes; a hit marks the IR used now, in its access
        # time: its write time is part of OpenVINO's key for the blob, which must still hit.
        month_ago = time.time() - 30 * 86400
        written = xml.stat().st_mtime_ns
        os.utime(xml, ns=(int(month_ago * 1e9), written))
        hit = _compile(resolve, "openvino", tmp_path)
        hit.close()
        assert hit.report.from_cache
        assert xml.stat().st_atime > month_ago + 29 * 86400
        assert xml.stat().st_mtime_ns == written
        # Over a cap of nothing (and with no grace for recent use) every entry goes.
        monkeypatch.setattr(cache, "CACHE_MAX_BYTES", 0)
        monkeypatch.setattr(cache, "KEEP_RECENT_S", 0.0)
        _compile(resolve, "openvino", tmp_path).close()
        assert not list((tmp_path / "ir").iterdir())
        assert not list((tmp_path / "compiled").iterdir())
        assert model.infer(_feeds(model)), "the compiled model stopped running"
    finally:
        model.close()
    again = _compile(resolve, "openvino", tmp_path)
    try:
        assert again.infer(_feeds(again))
    finally:
        again.close()


def test_a_device_passed_over_is_a_warning_once_per_compile(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    import openvino as ov

    if "NPU" in ov.Core().available_devices:
        pytest.skip("this box has an NPU: nothing falls back from it")
    caplog.set_level(logging.INFO, logger="edge_agent.runtime")
    pool = ModelPool(catalog)
    options = RuntimeOptions(device="NPU,CPU", cache_dir=catalog.cache)
    first, _ = pool.acquire("face-blazeface", "openvino", options)
    second, _ = pool.acquire("face-blazeface", "openvino", options)  # shared: no compile
    try:
        lines = [r for r in caplog.records if getattr(r, "event", None) == "device_fallback"]
        assert [r.levelno for r in lines] == [logging.WARNING]
        fields = lines[0].fields  # type: ignore[attr-defined]
        assert (fields["model"], fields["requested"]) == ("face-blazeface", "NPU,CPU")
        assert fields["used"] == first.report.device
        assert fields["reason"].startswith("NPU: ")
        # Without a fallback, nothing is said.
        caplog.clear()
        plain, _ = pool.acquire("face-blazeface", "openvino", RuntimeOptions(device="CPU"))
        pool.release(plain)
        assert [r for r in caplog.records if getattr(r, "event", None) == "device_fallback"] == []
    finally:
        pool.release(first)
        pool.release(second)
