"""What each `[detect]` mode finds and costs on camera-shaped clips, with person-ssdlite.

Clips (edge_agent.vision.clips): scikit-image scenes at 1280x720 and 1920x1080, 15 fps,
with truth boxes. In each, one person walks in, stops 3 s and walks out while a second
comes the other way, both 180-300 px tall at 720p (270-450 at 1080p), and a third, smaller
one (120 px at 720p) crosses behind them; empty scene before and after. For each mode:
- recall over the frames holding a person 180 px or taller at 720p (270 at 1080p), at
  least 90% in view, found by a box of IoU 0.3 or more;
- false frames: frames with nobody in them where anything was detected;
- model calls per frame while someone is in view, and while nobody is;
- one stream's throughput, flat out (frames rendered in memory, no decode), and so how
  many 15 fps streams of that camera the box takes at that mode's cost.
Then the cost of fitting a 720p frame into the model's input on the host (what the
pipeline does) against OpenVINO's PrePostProcessor resizing and padding inside the graph.

Every figure is printed with the CPU flags and the 1-minute load average when it was
taken; figures are noisy while anything else runs. The short version (default, about a
minute on 2 cores) runs the first 10 s of each clip, so its empty frames are the first
2 s, sweep included; --full runs the clips whole, --seeds more of them:

    python tools/bench_detect.py [--full] [--seeds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import consoles, cpu_flags, finish, flags_text, load_1m, print_machine
from rich.table import Table

from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.heads.base import Detection
from edge_agent.paths import Layout
from edge_agent.pipelines.base import FrameResult
from edge_agent.pipelines.clip_source import ClipSource
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sinks import CallbackSink
from edge_agent.pipelines.sources import FileSourceSpec
from edge_agent.pipelines.spec import DetectSpec, ModelRef, PipelineSpec
from edge_agent.runtime.pool import ModelPool
from edge_agent.vision.clips import Clip, Walker, walk_clip
from edge_agent.vision.geometry import Geometry

MODEL = "person-ssdlite"
FPS = 15.0
MODES = ("frame", "tiles", "regions")
SHORT_S = 10.0


@dataclass(frozen=True, slots=True)
class Figures:
    recall: float
    counted: int
    false_frames: float
    empty: int
    calls_walking: float
    calls_empty: float
    fps: float
    load: float


def scripted_clip(size: tuple[int, int], seed: int) -> Clip:
    """The standard two-walker script plus a smaller person crossing behind them.

    Walkers are drawn in order, so the small one, first, passes behind the others.
    """
    base = walk_clip(size, seed=seed)
    scale = size[1] / 720
    small = Walker(round(120 * scale), round(0.62 * size[1]), 3.0, -1)
    return walk_clip(size, seed=seed, walkers=(small, *base.walkers))


def hit(truth_box: tuple[int, int, int, int], d: Detection) -> bool:
    iw = min(d.box[2], truth_box[2]) - max(d.box[0], truth_box[0])
    ih = min(d.box[3], truth_box[3]) - max(d.box[1], truth_box[1])
    inter = max(0.0, iw) * max(0.0, ih)
    a = (d.box[2] - d.box[0]) * (d.box[3] - d.box[1])
    b = (truth_box[2] - truth_box[0]) * (truth_box[3] - truth_box[1])
    return inter > 0 and inter / (a + b - inter) >= 0.3


def measure(
    clip: Clip, mode: str, stop: int, pool: ModelPool, layout: Layout, tile: int | None
) -> Figures:
    seen: list[FrameResult] = []
    spec = PipelineSpec(
        id=f"bench-{mode}",
        model=ModelRef(name=MODEL),
        source=FileSourceSpec(path=Path("unused")),
        sinks=[],
        detect=DetectSpec(mode=mode, tile=tile, learn=False),
    )
    handle = PipelineHandle(
        spec, pool, [CallbackSink(seen.append)], layout=layout, frames=ClipSource(clip, stop=stop)
    )
    try:
        stats = handle.run()
    finally:
        handle.close()
    frames = [r for r in seen if r.frame >= 0]
    tall = 180 * clip.size[1] / 720
    counted = walking = empty = 0
    found = false = calls_walking = calls_empty = 0
    for r in frames:
        truth = clip.truth[r.frame]
        dets = [d for d in r.results if isinstance(d, Detection)]
        if truth:
            walking += 1
            calls_walking += r.calls
        else:
            empty += 1
            calls_empty += r.calls
            false += bool(dets)
        big = [t for t in truth if t.height >= tall and t.visible >= 0.9]
        if big:
            counted += 1
            found += any(hit(t.box, d) for t in big for d in dets)
    return Figures(
        recall=found / max(1, counted),
        counted=counted,
        false_frames=false / max(1, empty),
        empty=empty,
        calls_walking=calls_walking / max(1, walking),
        calls_empty=calls_empty / max(1, empty),
        fps=stats.fps,
        load=load_1m(),
    )


def fit_cost(pool: ModelPool, rounds: int = 5) -> list[tuple[str, float, float, float]]:
    """Frame-to-result ms, host fit vs in-graph resize (+pad), person-ssdlite, 1 request."""
    import openvino as ov
    from openvino.preprocess import ColorFormat, PaddingMode, PrePostProcessor, ResizeAlgorithm

    resolved = pool.catalog.resolve(MODEL)
    spec = resolved.manifest.input
    frame = scripted_clip((1280, 720), 0).frame(60)
    height, width = frame.shape[:2]
    core = ov.Core()

    def build(in_graph: bool, geometry: Geometry) -> Any:
        model = core.read_model(str(resolved.path))
        model.reshape({spec.name: [1, 300, 300, 3]})
        ppp = PrePostProcessor(model)
        inp = ppp.input(spec.name)
        shape = [1, height, width, 3] if in_graph else [1, 300, 300, 3]
        inp.tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC")).set_color_format(
            ColorFormat.BGR
        ).set_shape(shape)
        steps = inp.preprocess()
        t = geometry.target
        if in_graph and geometry.fit_mode == "stretch":
            steps.resize(ResizeAlgorithm.RESIZE_LINEAR, 300, 300)
        elif in_graph:
            # OpenVINO pads float tensors only: to f32, resize, pad with 114, back to u8.
            steps.convert_element_type(ov.Type.f32)
            steps.resize(ResizeAlgorithm.RESIZE_LINEAR, t[3] - t[1], t[2] - t[0])
            pads_end = [0, 300 - t[3], 300 - t[2], 0]
            steps.pad([0, t[1], t[0], 0], pads_end, 114.0, PaddingMode.CONSTANT)
            steps.convert_element_type(ov.Type.u8)
        steps.convert_color(ColorFormat.RGB)
        inp.model().set_layout(ov.Layout("NHWC"))
        return core.compile_model(ppp.build(), "CPU", {"PERFORMANCE_HINT": "LATENCY"})

    setups = []
    for fit in ("stretch", "letterbox"):
        geometry = Geometry.fit((width, height), (300, 300), fit)
        for in_graph in (False, True):
            request = build(in_graph, geometry).create_infer_request()
            setups.append((fit, in_graph, geometry, geometry.new_input(), request))
    times: dict[tuple[str, bool], list[float]] = {(s[0], s[1]): [] for s in setups}
    prepare: list[float] = []
    for _ in range(rounds):  # interleaved, so a busy moment hits every setup alike
        for fit, in_graph, geometry, buffer, request in setups:
            for i in range(25):
                t0 = time.perf_counter()
                if in_graph:
                    request.infer({0: frame[None]})
                else:
                    geometry.prepare(frame, buffer)
                    t1 = time.perf_counter()
                    request.infer({0: buffer[None]})
                    if i >= 5:
                        prepare.append(t1 - t0)
                if i >= 5:
                    times[(fit, in_graph)].append(time.perf_counter() - t0)
    return [
        (
            f"{fit}, {'in-graph' if in_graph else 'host'}",
            statistics.median(ts) * 1e3,
            statistics.median(prepare) * 1e3 if not in_graph else float("nan"),
            load_1m(),
        )
        for (fit, in_graph), ts in times.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--full", action="store_true", help="whole clips, not the short run")
    parser.add_argument("--seeds", type=int, default=1, help="clips per size")
    parser.add_argument("--tile", type=int, default=None, help="tile side (default h/2)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    out, err = consoles(140)
    import openvino

    report = print_machine(out, {"openvino": openvino.__version__})
    cache = Path(os.environ.get("EDGE_AGENT_CACHE", Layout.from_env(os.environ).cache))
    pool = ModelPool(Catalog(default_models_dir(), cache))
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-detect-{os.getpid()}"
    layout = Layout(cache=cache, state=state)
    table = Table(
        title=f"{MODEL}: detection modes on 15 fps clips",
        caption="\n".join(
            [
                flags_text(cpu_flags()),
                "recall: frames with a person >= 180 px at 720p (270 at 1080p), 90% in view",
                "streams: 15 fps streams of this camera the box takes, = stream FPS / 15",
                "load: 1-minute load average when the figure was taken",
            ]
        ),
        caption_justify="left",
    )
    for column in ("clip", "mode", "recall", "false frames", "calls/frame walking",
                   "calls/frame empty", "stream FPS", "streams", "load"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("clip", "mode") else "right")
    rows: list[dict[str, Any]] = []
    sizes: list[tuple[int, int]] = [(1280, 720), (1920, 1080)]
    for size in sizes:
        for seed in range(args.seeds):
            clip = scripted_clip(size, seed)
            stop = clip.frames if args.full else min(clip.frames, round(SHORT_S * FPS))
            name = f"{size[0]}x{size[1]} #{seed} ({stop / FPS:.0f} s)"
            for mode in MODES:
                err.print(f"{name}: {mode} ...")
                f = measure(clip, mode, stop, pool, layout, args.tile)
                rows.append({"clip": name, "mode": mode, **asdict(f)})
                table.add_row(
                    name,
                    mode,
                    f"{f.recall:.3f} of {f.counted}",
                    f"{f.false_frames:.3f} of {f.empty}",
                    f"{f.calls_walking:.2f}",
                    f"{f.calls_empty:.2f}",
                    f"{f.fps:.1f}",
                    f"{f.fps / FPS:.1f}",
                    f"{f.load:.2f}",
                )
    out.print(table)
    err.print("fit cost ...")
    fits = Table(
        title="Fitting a 1280x720 frame into person-ssdlite's 300x300 input, 1 request",
        caption=flags_text(cpu_flags()),
        caption_justify="left",
    )
    for column in ("fit", "frame to result ms (p50)", "host fit ms (p50)", "load"):
        fits.add_column(column, justify="left" if column == "fit" else "right")
    costs = fit_cost(pool)
    for label, total, host, load in costs:
        fits.add_row(label, f"{total:.2f}", "—" if np.isnan(host) else f"{host:.2f}", f"{load:.2f}")
    out.print(fits)
    report["modes"] = rows
    report["fit_cost"] = [
        {"fit": label, "frame_to_result_ms": total, "load": load} for label, total, _, load in costs
    ]
    finish(out, report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
