"""Motion boxes and the regions scheduler, on camera-shaped clips with truth boxes.

The model is stood in for by an ideal detector that finds a person when a region holds
nearly all of them at a size a 300x300 detector sees well: this tests the scheduling
(what is looked at, how often), not the model. The real model runs in the integration
tests and the tools/ benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Detection
from edge_agent.vision.clips import Clip, Walker, walk_clip, write_clip
from edge_agent.vision.geometry import Rect
from edge_agent.vision.motion import MotionDetector
from edge_agent.vision.regions import RegionGrid, RegionPlanner
from edge_agent.vision.tracker import Tracker
from edge_agent.vision.zones import Mask, Scene

MODEL = 300
SEEN_PX = 120
"""Model pixels a person must span for the stand-in detector to find them."""


def seen(region: Rect, box: Rect) -> bool:
    """Nearly all of `box` is in `region`, and big enough once scaled to the model."""
    w = min(region[2], box[2]) - max(region[0], box[0])
    h = min(region[3], box[3]) - max(region[1], box[1])
    area = (box[2] - box[0]) * (box[3] - box[1])
    side = max(region[2] - region[0], region[3] - region[1])
    inside = max(0, w) * max(0, h) >= 0.9 * area
    return inside and (box[3] - box[1]) * MODEL / side >= SEEN_PX


@dataclass
class Run:
    calls: list[int]
    found: list[bool]
    sweeps: list[int]


def run(clip: Clip, planner: RegionPlanner, detector: MotionDetector) -> Run:
    tracker = Tracker()
    calls: list[int] = []
    found: list[bool] = []
    sweeps: list[int] = []
    for i, image in enumerate(clip):
        ts = i / clip.fps
        motion = detector.detect(image)
        regions = planner.plan(ts, motion, [box for _, box in tracker.predicted(ts)])
        calls.append(len(regions))
        sweeps.append(sum(r in planner.sweep_tiles for r in regions))
        hits = [t.box for t in clip.truth[i] if any(seen(r, t.box) for r in regions)]
        found.append(bool(hits))
        tracker.update(ts, [Detection(label="person", class_id=1, score=0.9, box=b) for b in hits])
    return Run(calls, found, sweeps)


@pytest.fixture(scope="module")
def walk() -> Clip:
    # In from the left, a 2 s stop mid-frame, out to the right, then 2 s of empty scene.
    return walk_clip((1280, 720), walkers=[Walker(200, 650, 0.5, 1, 0.5, 2.0)], tail_s=2.0)


def test_motion_follows_a_walker_and_ignores_noise(walk: Clip) -> None:
    detector = MotionDetector(walk.size)
    hits = total = 0
    last_seen = -100
    for i, image in enumerate(walk):
        boxes = detector.detect(image)
        truth = walk.truth[i]
        if not truth:
            # Sensor noise moves nothing; her ghost fades within about 10 frames.
            assert boxes == [] or i - last_seen <= 10, (i, boxes)
            continue
        last_seen = i
        t = truth[0].box
        # Moved at least 4 px since the last frame (she eases out of her stop by 2 px).
        moving = i > 0 and walk.truth[i - 1] and abs(walk.truth[i - 1][0].box[0] - t[0]) >= 4
        if moving and truth[0].visible == 1.0:
            total += 1
            hits += any(
                b[0] <= t[2] and b[2] >= t[0] and b[1] <= t[3] and b[3] >= t[1] for b in boxes
            )
    assert total > 60
    assert hits == total


def test_a_lighting_change_is_not_motion() -> None:
    clip = walk_clip((1280, 720), walkers=[], tail_s=3.0, lighting=[(1.0, 1.4), (2.0, 0.8)])
    detector = MotionDetector(clip.size)
    moving = [i for i, image in enumerate(clip) if detector.detect(image)]
    assert moving == []
    assert detector.relearned == 2


def test_a_mask_zeroes_motion() -> None:
    clip = walk_clip((1280, 720), walkers=[Walker(200, 650, 0.0, 1)], tail_s=0.0)
    # Mask the lower half: her whole walk happens under it.
    scene = Scene(
        clip.size, masks=[Mask(points=((0, 0.5), (1, 0.5), (1, 1), (0, 1)), units="fraction")]
    )
    probe = MotionDetector(clip.size)
    detector = MotionDetector(clip.size, mask=scene.motion_mask(probe.size))
    for i, image in enumerate(clip):
        boxes = detector.detect(image)
        assert all(b[3] <= 0.5 * 720 + 16 for b in boxes), (i, boxes)
    with pytest.raises(EdgeAgentError):
        MotionDetector(clip.size, mask=np.zeros((10, 10), dtype=np.uint8))


def test_still_scene_runs_only_the_sweeps() -> None:
    clip = walk_clip((1280, 720), walkers=[], tail_s=12.0)
    planner = RegionPlanner(clip.size, MODEL)
    result = run(clip, planner, MotionDetector(clip.size))
    assert len(planner.sweep_tiles) == 15
    # Sweeps at 0, 5 and 10 s; nothing else.
    assert [i for i, c in enumerate(result.calls) if c] == [0, 75, 150]
    assert result.calls == result.sweeps
    assert np.mean(result.calls) <= 1.0


def test_regions_find_a_walker_within_three_calls_a_frame(walk: Clip) -> None:
    result = run(walk, RegionPlanner(walk.size, MODEL), MotionDetector(walk.size))
    whole = [i for i, t in enumerate(walk.truth) if t and t[0].visible == 1.0]
    present = [i for i, t in enumerate(walk.truth) if t]
    empty = [i for i, t in enumerate(walk.truth) if not t]
    recall = np.mean([result.found[i] for i in whole])
    assert recall >= 0.95, recall
    assert np.mean([result.calls[i] for i in present]) <= 3.0
    assert np.mean([result.calls[i] for i in empty]) <= 1.0
    # The stop: no motion after a moment, but the tracked region keeps her in view.
    stopped = [i for i in whole if i > 0 and walk.truth[i - 1][0].box == walk.truth[i][0].box]
    assert len(stopped) > 20
    assert all(result.found[i] for i in stopped)


def test_sweep_can_be_spread_over_frames() -> None:
    planner = RegionPlanner((1280, 720), MODEL, sweep_frames=5)
    calls = [len(planner.plan(i / 15, [])) for i in range(80)]
    assert calls[:5] == [3, 3, 3, 3, 3]
    assert sum(calls[5:75]) == 0
    assert calls[75] == 3


def test_motion_boxes_cluster_into_squares_no_smaller_than_the_model() -> None:
    planner = RegionPlanner((1280, 720), MODEL, sweep_every_s=1e9)
    planner.plan(0.0, [])  # the first frame's sweep
    near = planner.plan(0.1, [(100, 100, 140, 160), (180, 120, 220, 200)])
    assert len(near) == 1
    (x0, y0, x1, y1) = near[0]
    assert x1 - x0 == y1 - y0 == MODEL
    assert x0 <= 100
    assert x1 >= 220
    apart = planner.plan(0.2, [(100, 100, 140, 160), (1000, 500, 1040, 560)])
    assert len(apart) == 2
    big = planner.plan(0.3, [(400, 100, 800, 700)])
    # A motion box carries its own slack: a region just big enough, shifted into the frame.
    assert big == [(300, 100, 900, 700)]
    # A tracked box gets room to move: 600 tall with margin (810) is more than the frame's
    # height, so the square is cut to it (and letterboxed into the model later).
    assert planner.plan(0.4, [], [(400, 100, 800, 700)]) == [(195, 0, 1005, 720)]


def test_grid_sizes_a_region_for_the_whole_person(tmp_path: Path) -> None:
    grid = RegionGrid()
    planner = RegionPlanner((1280, 720), MODEL, grid=grid, sweep_every_s=1e9)
    hand = (640, 380, 680, 420)
    assert planner.side_for(hand) == MODEL
    # People around here are usually about 400 px tall.
    planner.learn([(560, 200 + k, 760, 600 + k) for k in range(10)])
    assert planner.side_for(hand) == pytest.approx(1.35 * 400, rel=0.02)
    path = tmp_path / "regions" / "cam.json"
    grid.save(path)
    again = RegionGrid.load(path)
    assert np.array_equal(again.mean, grid.mean)
    assert np.array_equal(again.count, grid.count)
    assert RegionGrid.load(tmp_path / "absent.json").count.sum() == 0
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(EdgeAgentError) as err:
        RegionGrid.load(path)
    assert err.value.code == "input.unreadable"


def test_clips_are_deterministic_and_their_truth_is_where_the_figure_is(tmp_path: Path) -> None:
    clip = walk_clip((1920, 1080), seed=3)
    again = walk_clip((1920, 1080), seed=3)
    assert all(270 <= w.height <= 450 for w in clip.walkers)
    frames_with = [i for i, t in enumerate(clip.truth) if t and t[0].visible == 1.0]
    i = frames_with[len(frames_with) // 2]
    image = clip.frame(i)
    assert np.array_equal(image, again.frame(i))
    x0, y0, x1, y1 = clip.truth[i][0].box
    empty = walk_clip((1920, 1080), seed=3, walkers=[]).frame(i)
    changed = np.abs(image.astype(int) - empty.astype(int)).max(axis=2) > 20
    ys, xs = np.nonzero(changed)
    assert abs(xs.min() - x0) <= 2
    assert abs(xs.max() + 1 - x1) <= 2
    assert abs(ys.min() - y0) <= 2
    assert abs(ys.max() + 1 - y1) <= 2

    short = walk_clip((1280, 720), walkers=[Walker(200, 650, 0.0, -1)], tail_s=0.0)
    short = Clip(short.size, short.fps, 12, short.walkers)
    meta = json.loads(write_clip(short, tmp_path / "walk.avi").read_text(encoding="utf-8"))
    assert meta["frames"] == 12
    assert len(meta["truth"]) == 12
    video = cv2.VideoCapture(str(tmp_path / "walk.avi"))
    count = 0
    while video.read()[0]:
        count += 1
    video.release()
    assert count == 12
