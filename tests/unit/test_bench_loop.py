"""`run_bench` keeps every request busy by submitting each next run from the last one's
`done`, as benchmark_app restarts a request from its callback; a model with one request is
run on the bench's own thread, run after run.

Real threads on a real `ThreadedModel`; its `_run` holds a worker for a millisecond, the
engine's part. A `done` that submits must never wait on its own model's queue (that would
hang the bench), and a run that fails must end the bench with its error, on time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest

from edge_agent.bench import BenchResult, run_bench
from edge_agent.catalog.catalog import default_models_dir
from edge_agent.catalog.manifest import Manifest, load_manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.base import CompileReport, Tensor, Tensors
from edge_agent.runtime.runs import ThreadedModel

SECONDS = 0.4


def _manifest() -> Manifest:
    return load_manifest(default_models_dir() / "face-blazeface.toml")


class _Engine(ThreadedModel):
    """Runs take a millisecond; counts how many run at once; fails from `fail_after` on."""

    def __init__(self, requests: int, fail_after: int | None = None) -> None:
        super().__init__("engine", requests)
        self.report = CompileReport(
            backend="openvino",
            requested="CPU",
            device="CPU",
            precision="f32",
            hint="throughput",
            requests=requests,
            compile_s=0.0,
            from_cache=False,
            inputs={"input": (1, 128, 128, 3)},
        )
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.runs = 0
        self._fail_after = fail_after

    def _run(self, inputs: Mapping[str, Tensor]) -> Tensors:
        with self._lock:
            self.runs += 1
            failing = self._fail_after is not None and self.runs > self._fail_after
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.001)
            if failing:
                raise EdgeAgentError("inference failed: the engine broke", code="inference.failed")
            return {}
        finally:
            with self._lock:
                self.running -= 1


def _bench(engine: _Engine) -> tuple[BenchResult | None, BaseException | None, float]:
    found: list[BenchResult | BaseException] = []

    def call() -> None:
        try:
            found.append(run_bench(engine, _manifest(), SECONDS))
        except BaseException as exc:  # handed to the test
            found.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(SECONDS + 10)
    assert not thread.is_alive(), "the bench hung: a done waited on its own queue"
    took = time.monotonic() - started
    (outcome,) = found
    if isinstance(outcome, BaseException):
        return None, outcome, took
    return outcome, None, took


@pytest.mark.parametrize("requests", [1, 2, 4, 8])
def test_every_request_stays_busy_and_the_bench_ends_on_time(requests: int) -> None:
    engine = _Engine(requests)
    result, error, took = _bench(engine)
    engine.close()
    assert error is None
    assert result is not None
    assert engine.most == requests, "every worker ran at once, and no more"
    # A millisecond a run on each request: far more than one request's worth of runs.
    assert result.iterations > SECONDS / 0.001 * 0.5
    assert result.iterations == engine.runs - 1  # all but the untimed first run
    assert took < SECONDS + 2.0


@pytest.mark.parametrize("requests", [1, 2])
def test_a_run_that_fails_ends_the_bench_with_its_error(requests: int) -> None:
    engine = _Engine(requests, fail_after=50)
    result, error, took = _bench(engine)
    engine.close()
    assert result is None
    assert isinstance(error, EdgeAgentError)
    assert "the engine broke" in str(error)
    assert took < SECONDS + 2.0
