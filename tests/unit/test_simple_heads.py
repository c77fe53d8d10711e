"""The SSD, classification and raw heads on synthetic outputs."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from pydantic import TypeAdapter

from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Classification, Detection, Outputs, TensorSummary
from edge_agent.heads.classification import ClassificationConfig, ClassificationHead, top_k
from edge_agent.heads.raw import RawConfig, RawHead
from edge_agent.heads.registry import HeadConfig, build_frame_head
from edge_agent.heads.ssd import SsdConfig, SsdHead, decode_ssd

F32 = npt.NDArray[np.float32]

SSD = SsdConfig(labels={1: "person", 3: "car"}, score_threshold=0.5)
FRAME = (200, 100)  # width, height


def _f32(values: object) -> F32:
    return np.asarray(values, dtype=np.float32)


def _ssd(
    boxes: object, classes: object, scores: object, count: int, config: SsdConfig = SSD
) -> list[Detection]:
    return decode_ssd(_f32(boxes), _f32(classes), _f32(scores), count, FRAME, config)


BOX = [0.1, 0.2, 0.5, 0.6]  # ymin, xmin, ymax, xmax


def test_ssd_threshold_keeps_scores_at_or_above_it() -> None:
    got = _ssd([BOX] * 4, [1, 1, 1, 1], [0.9, 0.5, 0.49, 0.1], 4)
    assert [d.score for d in got] == pytest.approx([0.9, 0.5])


def test_ssd_threshold_zero_keeps_everything_labelled() -> None:
    config = SsdConfig(labels={1: "person"}, score_threshold=0.0)
    got = _ssd([BOX] * 3, [1, 1, 1], [0.9, 0.01, 0.0], 3, config)
    assert len(got) == 3


def test_ssd_maps_labels_and_drops_unknown_class_ids() -> None:
    got = _ssd([BOX] * 5, [1, 2, 3, 0, 90], [0.9, 0.9, 0.8, 0.9, 0.9], 5)
    assert [(d.label, d.class_id) for d in got] == [("person", 1), ("car", 3)]


def test_ssd_class_ids_are_rounded_floats() -> None:
    got = _ssd([BOX] * 2, [0.9999999, 3.0000002], [0.9, 0.9], 2)
    assert [d.class_id for d in got] == [1, 3]


@pytest.mark.parametrize(("count", "expected"), [(0, 0), (1, 1), (2, 2), (3, 3), (99, 3), (-1, 0)])
def test_ssd_count_limits_the_rows_read(count: int, expected: int) -> None:
    got = _ssd([BOX] * 3, [1, 1, 1], [0.9, 0.8, 0.7], count)
    assert len(got) == expected
    assert [d.score for d in got] == pytest.approx([0.9, 0.8, 0.7][:expected])


def test_ssd_rows_past_count_are_ignored_even_when_they_score_high() -> None:
    got = _ssd([BOX, BOX], [1, 1], [0.6, 0.99], 1)
    assert [d.score for d in got] == pytest.approx([0.6])


def test_ssd_box_is_xyxy_in_frame_pixels() -> None:
    [det] = _ssd([BOX], [1], [0.9], 1)
    # x = 0.2 and 0.6 of width 200, y = 0.1 and 0.5 of height 100.
    assert det.box == pytest.approx((40.0, 10.0, 120.0, 50.0))


def test_ssd_box_is_clipped_to_the_frame() -> None:
    [det] = _ssd([[-0.1, 1.2, 0.5, 1.5]], [3], [0.7], 1)
    assert det.box == pytest.approx((200.0, 0.0, 200.0, 50.0))
    [det] = _ssd([[-2.0, -2.0, 3.0, 3.0]], [3], [0.7], 1)
    assert det.box == pytest.approx((0.0, 0.0, 200.0, 100.0))


def test_ssd_score_above_one_is_capped() -> None:
    [det] = _ssd([BOX], [1], [1.0001], 1)
    assert det.score == 1.0


@given(
    arrays(np.float32, (6, 4), elements=st.floats(-1.0, 2.0, width=32)),
    arrays(np.float32, (6,), elements=st.floats(0.0, 1.0, width=32)),
    st.integers(0, 8),
)
def test_ssd_boxes_always_lie_in_the_frame(boxes: F32, scores: F32, count: int) -> None:
    got = decode_ssd(boxes, np.ones(6, dtype=np.float32), scores, count, FRAME, SSD)
    assert len(got) <= min(count, 6)
    for det in got:
        x0, y0, x1, y1 = det.box
        assert 0.0 <= x0 <= 200.0
        assert 0.0 <= x1 <= 200.0
        assert 0.0 <= y0 <= 100.0
        assert 0.0 <= y1 <= 100.0
        assert det.score >= SSD.score_threshold


def _ssd_row_by_row(
    boxes: F32, classes: F32, scores: F32, count: int, config: SsdConfig
) -> list[tuple[str, int, float, tuple[float, ...]]]:
    """What the head must give, read one row at a time as the graph's outputs are defined."""
    width, height = FRAME
    found: list[tuple[str, int, float, tuple[float, ...]]] = []
    for i in range(max(0, min(count, scores.shape[0]))):
        score = float(scores[i])
        class_id = round(float(classes[i]))
        if score < config.score_threshold or class_id not in config.labels:
            continue
        y0, x0, y1, x1 = (min(max(float(v), 0.0), 1.0) for v in boxes[i])
        box = (x0 * width, y0 * height, x1 * width, y1 * height)
        found.append((config.labels[class_id], class_id, min(score, 1.0), box))
    return found


@given(
    arrays(np.float32, (12, 4), elements=st.floats(-0.5, 1.5, width=32)),
    arrays(np.float32, (12,), elements=st.sampled_from([0.0, 1.0, 2.0, 3.0, 2.5, 0.9999999, 4.0])),
    arrays(np.float32, (12,), elements=st.sampled_from([0.0, 0.2, 0.4999, 0.5, 0.5001, 0.9, 1.0])),
    st.integers(-1, 14),
)
def test_ssd_decode_matches_reading_row_by_row(
    boxes: F32, classes: F32, scores: F32, count: int
) -> None:
    got = decode_ssd(boxes, classes, scores, count, FRAME, SSD)
    want = _ssd_row_by_row(boxes, classes, scores, count, SSD)
    assert [(d.label, d.class_id, d.score) for d in got] == [w[:3] for w in want]
    for det, (*_, box) in zip(got, want, strict=True):
        assert det.box == pytest.approx(box, abs=1e-9)


def test_ssd_head_reads_batched_outputs_by_name() -> None:
    outputs: Outputs = {
        "detection_boxes:0": _f32([[BOX, [0.0, 0.0, 1.0, 1.0], BOX]]),
        "detection_classes:0": _f32([[1, 3, 1]]),
        "detection_scores:0": _f32([[0.95, 0.85, 0.2]]),
        "num_detections:0": _f32([2.0]),
    }
    got = SsdHead(SSD).decode(outputs, FRAME)
    found = [r for r in got if isinstance(r, Detection)]
    assert len(found) == len(got)
    assert [d.label for d in found] == ["person", "car"]
    assert found[1].box == pytest.approx((0.0, 0.0, 200.0, 100.0))


def test_ssd_head_with_custom_output_names_and_empty_count() -> None:
    config = SsdConfig(
        labels={1: "person"}, boxes="b", classes="c", scores="s", count="n", score_threshold=0.1
    )
    outputs: Outputs = {
        "b": _f32([[BOX]]),
        "c": _f32([[1]]),
        "s": _f32([[0.9]]),
        "n": _f32([]),
    }
    assert SsdHead(config).decode(outputs, FRAME) == []
    with pytest.raises(EdgeAgentError, match=r"no output '.*' \(.*\); it has: b, c, n, s") as e:
        SsdHead(SSD).decode(outputs, FRAME)
    assert e.value.code == "model.incompatible"
    assert "set [head] count in the model's manifest" in e.value.fix


LABELS = ["cat", "dog", "bird", "fish"]


def _ids(found: list[Classification]) -> list[int]:
    return [c.class_id for c in found]


def test_top_k_is_best_first_with_labels() -> None:
    got = top_k(_f32([0.1, 0.5, 0.15, 0.25]), 3, LABELS, softmax=False)
    assert _ids(got) == [1, 3, 2]
    assert [c.label for c in got] == ["dog", "fish", "bird"]
    assert [c.score for c in got] == pytest.approx([0.5, 0.25, 0.15])


def test_top_1() -> None:
    got = top_k(_f32([[3.0, -1.0, 7.0, 2.0]]), 1, LABELS, softmax=True)
    assert _ids(got) == [2]


def test_softmax_by_hand() -> None:
    got = top_k(_f32([0.0, math.log(3.0)]), 2, ["a", "b"], softmax=True)
    assert [c.label for c in got] == ["b", "a"]
    assert [c.score for c in got] == pytest.approx([0.75, 0.25])


def test_softmax_on_sums_to_one_and_keeps_order() -> None:
    logits = _f32([2.0, -3.0, 0.5, 9.0])
    got = top_k(logits, 4, LABELS, softmax=True)
    assert sum(c.score for c in got) == pytest.approx(1.0)
    assert _ids(got) == [3, 0, 2, 1]
    assert all(0.0 < c.score < 1.0 for c in got)


def test_softmax_off_passes_scores_through() -> None:
    probs = _f32([0.3, 0.3, 0.3, 0.3])  # sums to 1.2: not renormalised
    got = top_k(probs, 4, LABELS, softmax=False)
    assert sum(c.score for c in got) == pytest.approx(1.2)
    assert all(c.score == pytest.approx(0.3) for c in got)


def test_softmax_of_huge_logits_does_not_overflow() -> None:
    got = top_k(_f32([1000.0, 999.0, -1000.0]), 3, ["a", "b", "c"], softmax=True)
    assert all(math.isfinite(c.score) for c in got)
    assert got[0].score == pytest.approx(1.0 / (1.0 + math.exp(-1.0)))
    assert got[2].score == pytest.approx(0.0)


def test_k_larger_than_the_classes_returns_every_class() -> None:
    got = top_k(_f32([0.2, 0.7, 0.1]), 10, ["a", "b", "c"], softmax=False)
    assert _ids(got) == [1, 0, 2]


def test_classes_beyond_the_labels_are_named_by_index() -> None:
    got = top_k(_f32([0.1, 0.2, 0.9]), 2, ["a", "b"], softmax=False)
    assert [(c.label, c.class_id) for c in got] == [("2", 2), ("b", 1)]


@given(
    arrays(np.float32, st.integers(1, 50), elements=st.floats(-50.0, 50.0, width=32)),
    st.integers(1, 60),
    st.booleans(),
)
def test_top_k_properties(scores: F32, k: int, softmax: bool) -> None:
    got = top_k(scores, k, LABELS, softmax)
    assert len(got) == min(k, scores.size)
    ids = _ids(got)
    assert len(set(ids)) == len(ids)
    values = [c.score for c in got]
    assert values == sorted(values, reverse=True)
    # Nothing left out beats anything kept.
    # (Compared as the head sees them: softmax can tie scores a hair apart.)
    seen = np.exp(scores.astype(np.float64) - scores.max()) if softmax else scores
    left_out = np.delete(seen, ids)
    if left_out.size:
        assert float(seen[ids[-1]]) >= float(left_out.max())
    if softmax:
        assert all(0.0 <= v <= 1.0 for v in values)
        if k >= scores.size:
            assert sum(values) == pytest.approx(1.0)
    else:
        assert values == pytest.approx([float(scores[i]) for i in ids])


def test_classification_head_reads_its_output() -> None:
    config = ClassificationConfig(output="probs", labels=LABELS, top_k=2, softmax=False)
    outputs: Outputs = {"probs": _f32([[0.1, 0.2, 0.6, 0.1]]), "other": _f32([[9, 9, 9, 9]])}
    got = ClassificationHead(config).decode(outputs, FRAME)
    found = [r for r in got if isinstance(r, Classification)]
    assert len(found) == len(got) == 2
    assert [r.label for r in found] == ["bird", "dog"]
    assert [r.score for r in found] == pytest.approx([0.6, 0.2])


def _summaries(outputs: Outputs) -> list[TensorSummary]:
    found = RawHead(RawConfig()).decode(outputs, FRAME)
    assert all(isinstance(r, TensorSummary) for r in found)
    return [r for r in found if isinstance(r, TensorSummary)]


def test_raw_summarises_a_tensor_by_hand() -> None:
    tensor = _f32([[1.0, -2.0, 7.0], [4.0, 0.0, 2.0]])
    [s] = _summaries({"logits": tensor})
    assert s.name == "logits"
    assert s.shape == (2, 3)
    assert s.dtype == "float32"
    assert (s.min, s.max, s.mean, s.argmax) == (-2.0, 7.0, 2.0, 2)


def test_raw_reports_each_tensor_once_under_two_names() -> None:
    shared = _f32([[1.0, 2.0]])
    other = np.arange(6, dtype=np.int64).reshape(2, 3)
    got = _summaries({"scores:0": shared, "scores": shared, "boxes": other})
    assert sorted(s.name for s in got) == ["boxes", "scores"]
    assert {s.name: s.shape for s in got} == {"boxes": (2, 3), "scores": (1, 2)}
    assert {s.name: s.dtype for s in got} == {"boxes": "int64", "scores": "float32"}


def test_raw_reports_equal_but_distinct_tensors_separately() -> None:
    got = _summaries({"a": _f32([1.0, 2.0]), "b": _f32([1.0, 2.0])})
    assert [s.name for s in got] == ["a", "b"]


def test_raw_handles_an_empty_tensor() -> None:
    [s] = _summaries({"none": np.zeros((1, 0, 4), dtype=np.float32)})
    assert s.shape == (1, 0, 4)
    assert (s.min, s.max, s.mean, s.argmax) == (0.0, 0.0, 0.0, 0)


@pytest.mark.parametrize(
    "table",
    [
        {"type": "ssd", "labels": {1: "person"}},
        {"type": "blazeface"},
        {"type": "classification", "output": "prob", "labels": ["a"]},
        {"type": "dbnet"},
        {"type": "yolo", "labels": ["a"]},
    ],
)
def test_every_head_names_a_missing_output(table: dict[str, object]) -> None:
    # A wrong output name in a user's manifest gave a KeyError traceback.
    config = TypeAdapter(HeadConfig).validate_python(table)
    outputs: Outputs = {"logits": _f32([[0.5]]), "other": _f32([[0.5]])}
    with pytest.raises(EdgeAgentError, match=r"model has no output '.+'.*it has: logits, other"):
        build_frame_head(config).decode(outputs, FRAME)
