"""One compiled model shared by many threads, as the pool shares it between pipelines."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.heads.vad import VadConfig, audio_windows
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import CompiledModel, RuntimeOptions, Tensors
from edge_agent.runtime.stateful import StatefulVad
from tests.conftest import sample

BACKENDS = ["openvino", "onnxruntime"]
Resolve = Callable[[str], ResolvedModel]


def _own(resolve: Resolve, name: str, backend: str, cache: Path, **kw: object) -> CompiledModel:
    # Compiled here, not taken from the session fixture: these tests close their models.
    resolved = resolve(name)
    options = RuntimeOptions.model_validate({"cache_dir": cache, **kw})
    return create_backend(backend).compile(resolved.path, resolved.manifest, options)


def _f32(values: object) -> npt.NDArray[np.float32]:
    return np.asarray(values, dtype=np.float32)


def _pages() -> list[npt.NDArray[np.uint8]]:
    page = sample("page")
    return [
        np.ascontiguousarray(np.repeat(np.rot90(page, k)[:, :, None], 3, axis=2)) for k in range(4)
    ]


def _hammer(workers: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(len(workers))

    def _run(work: Callable[[], None]) -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # collected and asserted on by the test
            errors.append(exc)

    threads = [threading.Thread(target=_run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    return errors


@pytest.mark.parametrize("backend", BACKENDS)
def test_infer_and_submit_from_many_threads(
    resolve: Resolve, cache_dir: Path, backend: str
) -> None:
    model = _own(resolve, "text-orientation", backend, cache_dir)
    name = resolve("text-orientation").manifest.input.name
    pages = _pages()
    expected = [model.infer({name: p[None]})["fetch_name_0"] for p in pages]
    got: list[tuple[int, Tensors]] = []
    lock = threading.Lock()

    def done(outputs: Tensors, index: object, latency: float) -> None:
        with lock:
            got.append((int(index), outputs))  # type: ignore[call-overload]

    def infers() -> None:
        for i in range(24):
            out = model.infer({name: pages[i % 4][None]})["fetch_name_0"]
            np.testing.assert_allclose(_f32(out), _f32(expected[i % 4]), atol=1e-4)

    def submits() -> None:
        for i in range(24):
            model.submit({name: pages[i % 4][None]}, done, i % 4)
        model.wait()

    errors = _hammer([infers, infers, submits, submits])
    assert errors == []
    model.wait()
    assert len(got) == 48
    for index, outputs in got:
        np.testing.assert_allclose(_f32(outputs["fetch_name_0"]), _f32(expected[index]), atol=1e-4)
    model.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_vads_share_one_model(resolve: Resolve, cache_dir: Path, backend: str) -> None:
    """Two stateful VAD streams on one pooled model, each getting its own answers."""
    resolved = resolve("vad-silero")
    head = resolved.manifest.head
    assert isinstance(head, VadConfig)
    model = _own(resolve, "vad-silero", backend, cache_dir)
    rng = np.random.default_rng(7)
    t = np.arange(16000 * 2, dtype=np.float32) / 16000
    # Two different signals, so a state crossed between streams changes the answers.
    clips = [
        (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32),
        (0.1 * rng.standard_normal(t.size)).astype(np.float32),
    ]

    def run(clip: npt.NDArray[np.float32]) -> list[float]:
        vad = StatefulVad(model, head)
        return [vad.step(w) for w in audio_windows(clip, head.window, head.context)]

    alone = [run(c) for c in clips]
    together: list[list[float]] = [[], []]

    def stream(i: int) -> Callable[[], None]:
        return lambda: together[i].extend(run(clips[i]))

    assert _hammer([stream(0), stream(1)]) == []
    for i in range(2):
        np.testing.assert_allclose(together[i], alone[i], atol=1e-5)
    model.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_wait_covers_every_submit_from_every_thread(
    resolve: Resolve, cache_dir: Path, backend: str
) -> None:
    """`wait` returns only after each thread's runs called `done`, whoever submitted them."""
    # Throughput: several runs at once, so a run lost from the books would still be going.
    model = _own(resolve, "vad-silero", backend, cache_dir, hint="throughput")
    feeds = {n: np.zeros(s, dtype=np.float32) for n, s in model.report.inputs.items()}
    # Switch threads as often as the interpreter can, so unlocked bookkeeping shows up.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _submit_rounds(model, feeds)
    finally:
        sys.setswitchinterval(interval)
    model.close()


def _submit_rounds(model: CompiledModel, feeds: dict[str, npt.NDArray[np.float32]]) -> None:
    calls = [0]
    lock = threading.Lock()

    def done(outputs: Tensors, userdata: object, latency: float) -> None:
        with lock:
            calls[0] += 1

    def submits() -> None:
        for _ in range(200):
            model.submit(feeds, done, None)

    for _ in range(5):
        calls[0] = 0
        assert _hammer([submits, submits, submits]) == []
        model.wait()
        assert calls[0] == 600
