"""ONNX Runtime at its best on this box: the reference edge-agent's ORT backend is held to.

A small grid of what an ORT user can tune (threads calling `run` at once on one session,
intra-op threads, execution mode, graph optimisation level) is probed briefly, twice over,
and the fastest setting is the reference. It is fed the model's own input tensor, already prepared,
so edge-agent's host-side preprocessing counts against edge-agent, as a user would see it.

tools/bench_runtime.py runs it in its own process, as it runs `edge-agent bench`, so neither
shares a process (or leftover thread pools) with anything else:

    python tools/ort_session.py tune MODEL.onnx INPUT 1,3,224,224 --time 0.5   # best config
    python tools/ort_session.py run MODEL.onnx INPUT 1,3,224,224 --time 8 --config '{...}'
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import MeasureError, ModelUnderTest, Run, Say, one_line, run_command

_DTYPES: dict[str, type[np.generic]] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}


@dataclass(frozen=True, slots=True)
class OrtConfig:
    """One point of the grid."""

    streams: int
    """Threads calling `run` at once on the one session."""
    intra_threads: int
    """Intra-op threads; 0 lets ONNX Runtime choose (one per physical core)."""
    mode: str
    """"sequential" or "parallel" execution of independent nodes."""
    level: str
    """Graph optimisation: "extended" or "all" (adds layout optimisations)."""

    def label(self) -> str:
        intra = self.intra_threads or "auto"
        return f"{self.streams} stream(s), {intra} intra-op, {self.mode}, opt {self.level}"


def grid(cores: int) -> list[OrtConfig]:
    """One stream with ORT's own thread count or all cores; then cores split among streams."""
    configs: list[OrtConfig] = []
    for streams in sorted({1, 2, cores}):
        if streams > cores:
            continue
        split = max(1, cores // streams)
        for intra in sorted({0, split}) if streams == 1 else [split]:
            for mode in ("sequential", "parallel"):
                for level in ("all", "extended"):
                    configs.append(OrtConfig(streams, intra, mode, level))
    return configs


def _feeds(session: Any, model: ModelUnderTest) -> dict[str, Any]:
    """Deterministic noise for every input: the image input at the model's shape."""
    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {}
    for node in session.get_inputs():
        dtype = _DTYPES.get(node.type)
        if dtype is None:
            raise MeasureError(f"{model.name}: input {node.name} has type {node.type}")
        if node.name == model.input_name:
            dims = list(model.shape)
        else:
            dims = [d if isinstance(d, int) and d > 0 else 1 for d in node.shape]
        if np.issubdtype(dtype, np.integer):
            feeds[node.name] = rng.integers(0, 256, dims).astype(dtype)
        else:
            feeds[node.name] = rng.random(dims).astype(dtype)
    return feeds


class TunedSession:
    """One InferenceSession set up as `config` says, and a timed loop over it."""

    def __init__(self, model: ModelUnderTest, config: OrtConfig) -> None:
        import onnxruntime as ort

        self.config = config
        options = ort.SessionOptions()
        options.intra_op_num_threads = config.intra_threads
        options.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL
            if config.mode == "parallel"
            else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        options.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        }[config.level]
        options.log_severity_level = 3
        try:
            self._session: Any = ort.InferenceSession(
                str(model.path), options, providers=["CPUExecutionProvider"]
            )
            self._feeds = _feeds(self._session, model)
            self._session.run(None, self._feeds)  # The first run allocates; keep it untimed.
        except MeasureError:
            raise
        except Exception as exc:  # ORT raises its own exception types from C++
            raise MeasureError(
                f"ONNX Runtime cannot run {model.name}: {one_line(str(exc))}"
            ) from None

    def run(self, seconds: float) -> Run:
        """Every stream calls `run` back to back until the time is up."""
        latencies: list[list[float]] = [[] for _ in range(self.config.streams)]
        failures: list[str] = []
        deadline = time.perf_counter() + seconds

        def loop(mine: list[float]) -> None:
            try:
                while (started := time.perf_counter()) < deadline:
                    self._session.run(None, self._feeds)
                    mine.append(time.perf_counter() - started)
            except Exception as exc:  # reported once, as the run's error
                failures.append(one_line(str(exc)))

        begin = time.perf_counter()
        threads = [threading.Thread(target=loop, args=(mine,)) for mine in latencies]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - begin
        if failures:
            raise MeasureError(f"ONNX Runtime failed mid-run: {failures[0]}")
        done = [x for mine in latencies for x in mine]
        if not done:
            raise MeasureError(f"no inference finished in {seconds:.2f} s")
        return Run(
            fps=len(done) / elapsed,
            p50_ms=float(np.percentile(done, 50)) * 1e3,
            p95_ms=float(np.percentile(done, 95)) * 1e3,
            precision="f32",
            requests=self.config.streams,
        )


def tune(
    model: ModelUnderTest, probe_seconds: float, say: Say
) -> tuple[TunedSession, list[tuple[OrtConfig, float]]]:
    """Probe every grid point twice, the second pass in reverse order, and judge each on
    the mean of its two looks; return the fastest session and every point's mean FPS.

    One look each let a noisy moment pick a slow setting (on a shared 2-core box a single
    pass once chose one wide stream at 640 FPS over two narrow ones at 900), and a weak
    reference flatters the backend it judges. The better of two looks was no cure: it
    favours the setting that swings most (one wide stream on text-det-ppocr read 24-34 FPS
    round to round, two narrow ones a steady 36).
    """
    configs = grid(os.cpu_count() or 1)
    sessions = [TunedSession(model, config) for config in configs]
    seen = [0.0] * len(configs)
    for order in (range(len(configs)), reversed(range(len(configs)))):
        for i in order:
            fps = sessions[i].run(probe_seconds).fps
            say(f"    {configs[i].label()}: {fps:.1f} FPS")
            seen[i] += fps / 2
    if not configs:
        raise MeasureError("the ONNX Runtime grid is empty")
    best = max(range(len(configs)), key=lambda i: seen[i])
    return sessions[best], list(zip(configs, seen, strict=True))


def _command(action: str, model: ModelUnderTest, seconds: float) -> list[str]:
    shape = ",".join(str(d) for d in model.shape)
    return [sys.executable, __file__, action, str(model.path), model.input_name, shape,
            "--time", str(seconds)]  # fmt: skip


def tune_apart(model: ModelUnderTest, probe_seconds: float) -> tuple[OrtConfig, int]:
    """`tune` in its own process: the best config and how many were tried."""
    out = run_command(_command("tune", model, probe_seconds))
    try:
        found = json.loads(out.strip().splitlines()[-1])
        return OrtConfig(**found["best"]), int(found["tried"])
    except (json.JSONDecodeError, IndexError, KeyError, TypeError) as exc:
        raise MeasureError(f"ort_session.py tune printed no config: {exc}") from None


def run_apart(model: ModelUnderTest, config: OrtConfig, seconds: float) -> Run:
    """One timed run of `config` in its own process."""
    argv = [*_command("run", model, seconds), "--config", json.dumps(asdict(config))]
    out = run_command(argv)
    try:
        return Run(**json.loads(out.strip().splitlines()[-1]))
    except (json.JSONDecodeError, IndexError, TypeError) as exc:
        raise MeasureError(f"ort_session.py run printed no result: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("action", choices=("tune", "run"))
    parser.add_argument("model", type=Path, help="ONNX file")
    parser.add_argument("input", help="name of the image input")
    parser.add_argument("shape", help="its shape, e.g. 1,3,224,224")
    parser.add_argument("--time", type=float, required=True, help="seconds (per setting: tune)")
    parser.add_argument("--config", help="run: the OrtConfig as JSON, as tune prints it")
    args = parser.parse_args(argv)
    shape = tuple(int(d) for d in args.shape.split(","))
    model = ModelUnderTest(args.model.name, args.model, "onnx", args.input, shape)
    try:
        if args.action == "tune":
            session, tried = tune(model, args.time, lambda line: print(line, file=sys.stderr))
            print(json.dumps({"best": asdict(session.config), "tried": len(tried)}))
        else:
            config = OrtConfig(**json.loads(args.config or "{}"))
            print(json.dumps(asdict(TunedSession(model, config).run(args.time))))
    except (MeasureError, TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
