"""The `[detect]` modes on camera-shaped 720p clips, with person-ssdlite and truth boxes.

A 220 px person in a 1280x720 frame is 92 px tall once the whole frame is squeezed into
300x300, too small for person-ssdlite; tiles and regions look at them at full size.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.catalog.catalog import Catalog
from edge_agent.heads.base import Detection
from edge_agent.paths import Layout
from edge_agent.pipelines.base import FrameResult
from edge_agent.pipelines.clip_source import ClipSource
from edge_agent.pipelines.events import EventRule
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sinks import CallbackSink
from edge_agent.pipelines.sources import FileSourceSpec
from edge_agent.pipelines.spec import DetectSpec, ModelRef, PipelineSpec
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats
from edge_agent.vision.clips import Clip, Truth, Walker, walk_clip
from edge_agent.vision.zones import Mask, Zone

WALK_FRAMES = 68
"""4.5 s: in from the left edge, a 1 s stop, on again."""
MASK = Mask(points=((0, 0), (0.25, 0), (0.25, 1), (0, 1)), units="fraction", name="left")


@pytest.fixture(scope="module")
def walk() -> Clip:
    return walk_clip((1280, 720), walkers=[Walker(220, 660, 0.0, 1, 0.3, 1.0)], tail_s=0.0)


@pytest.fixture(scope="module")
def still() -> Clip:
    return walk_clip((1280, 720), walkers=[], tail_s=3.0)


@pytest.fixture(scope="module")
def pool(catalog: Catalog) -> ModelPool:
    return ModelPool(catalog)


def run(
    spec: PipelineSpec, pool: ModelPool, source: ClipSource, layout: Layout
) -> tuple[list[FrameResult], PipelineStats]:
    seen: list[FrameResult] = []
    handle = PipelineHandle(spec, pool, [CallbackSink(seen.append)], layout=layout, frames=source)
    try:
        stats = handle.run()
    finally:
        handle.close()
    return seen, stats


def spec_of(name: str, **update: object) -> PipelineSpec:
    return PipelineSpec(
        id=name,
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=Path("unused")),
        sinks=[],
    ).model_copy(update=update)


def found(truth: list[Truth], result: FrameResult) -> bool:
    """A detection overlaps the person by IoU 0.3 or more."""
    for d in result.results:
        if not isinstance(d, Detection):
            continue
        for t in truth:
            iw = min(d.box[2], t.box[2]) - max(d.box[0], t.box[0])
            ih = min(d.box[3], t.box[3]) - max(d.box[1], t.box[1])
            inter = max(0.0, iw) * max(0.0, ih)
            area_d = (d.box[2] - d.box[0]) * (d.box[3] - d.box[1])
            area_t = (t.box[2] - t.box[0]) * (t.box[3] - t.box[1])
            if inter / (area_d + area_t - inter) >= 0.3:
                return True
    return False


def recall(clip: Clip, results: list[FrameResult]) -> float:
    """Over frames holding a person 180 px or taller, at least 90% in view."""
    counted = [
        r
        for r in results
        if r.frame >= 0 and any(t.height >= 180 and t.visible >= 0.9 for t in clip.truth[r.frame])
    ]
    assert len(counted) >= 10
    return sum(found(clip.truth[r.frame], r) for r in counted) / len(counted)


def feet(d: Detection) -> tuple[float, float]:
    return (d.box[0] + d.box[2]) / 2, d.box[3]


def test_regions_find_a_walker_at_about_one_call_a_frame_and_zones_gate_events(
    walk: Clip, pool: ModelPool, tmp_path: Path
) -> None:
    layout = Layout(cache=pool.catalog.cache, state=tmp_path)
    floor = Zone(name="floor", points=((0, 600), (1280, 600), (1280, 720), (0, 720)))
    sky = Zone(name="sky", points=((0, 0), (1280, 0), (1280, 500), (0, 500)))
    rules = [
        EventRule(name="on-floor", label="person", zone="floor", gone_after_s=1.0),
        # The person's head and chest cross this zone; their feet never do.
        EventRule(name="in-sky", label="person", zone="sky", gone_after_s=1.0),
    ]
    spec = spec_of("regions", detect=DetectSpec(mode="regions"), zones=[floor, sky], events=rules)
    seen, stats = run(spec, pool, ClipSource(walk, stop=WALK_FRAMES), layout)
    frames = [r for r in seen if r.frame >= 0]
    assert len(frames) == WALK_FRAMES
    assert recall(walk, frames) >= 0.95
    assert stats.mode == "regions"
    assert stats.calls_per_frame <= 3.0
    fired = {(e.rule, e.kind) for r in seen for e in r.events}
    assert ("on-floor", "appeared") in fired
    assert not any(rule == "in-sky" for rule, _ in fired)
    # The detections did reach into the sky zone: only their feet did not.
    assert any(d.box[1] < 500 for r in frames for d in r.results if isinstance(d, Detection))
    # The learned object sizes are kept for the camera's next run.
    assert layout.regions("regions").is_file()
    # With a mask over the left quarter, a detection whose feet are there is dropped.
    masked_spec = spec_of("masked", detect=DetectSpec(mode="regions"), masks=[MASK])
    masked, _ = run(masked_spec, pool, ClipSource(walk, stop=WALK_FRAMES), layout)
    in_left = [
        d
        for r in frames
        for d in r.results
        if isinstance(d, Detection) and feet(d)[0] < 0.25 * 1280
    ]
    assert in_left, "the walker's feet cross the left quarter unmasked"
    kept = [d for r in masked if r.frame >= 0 for d in r.results if isinstance(d, Detection)]
    assert kept, "the walker is still found outside the mask"
    assert all(feet(d)[0] >= 0.25 * 1280 for d in kept)


def test_a_still_scene_costs_only_the_sweep(still: Clip, pool: ModelPool, tmp_path: Path) -> None:
    layout = Layout(cache=pool.catalog.cache, state=tmp_path)
    spec = spec_of("still", detect=DetectSpec(mode="regions"))
    seen, stats = run(spec, pool, ClipSource(still), layout)
    frames = [r for r in seen if r.frame >= 0]
    assert len(frames) == still.frames == 45
    assert stats.calls_per_frame <= 1.0
    # One sweep on the first frame (15 tiles of 360 px), then nothing moves: no calls.
    assert stats.calls_per_frame == pytest.approx(15 / 45)
    assert all(r.timings["infer"] == 0 for r in frames[1:])
    assert not any(isinstance(d, Detection) for r in frames for d in r.results)


def test_tiles_find_the_walker(walk: Clip, pool: ModelPool, tmp_path: Path) -> None:
    layout = Layout(cache=pool.catalog.cache, state=tmp_path)
    spec = spec_of("tiles", detect=DetectSpec(mode="tiles", tile=360))
    # Tiles keep no state from frame to frame: every 3rd frame is a fair sample.
    seen, stats = run(spec, pool, ClipSource(walk, start=15, stop=WALK_FRAMES, step=3), layout)
    assert (stats.mode, stats.calls_per_frame) == ("tiles", 15.0)
    assert recall(walk, seen) >= 0.9


def test_the_whole_frame_alone_misses_the_walker(
    walk: Clip, pool: ModelPool, tmp_path: Path
) -> None:
    # Why the modes exist: one aspect-true call over the frame is cheap, and blind here.
    layout = Layout(cache=pool.catalog.cache, state=tmp_path)
    seen, stats = run(spec_of("frame"), pool, ClipSource(walk, stop=WALK_FRAMES), layout)
    assert (stats.mode, stats.calls_per_frame) == ("frame", 1.0)
    assert recall(walk, seen) < 0.9
