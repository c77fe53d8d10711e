"""Heads' results, decoded in model-input pixels, mapped back to frame pixels.

The one inverse every head's results go through: boxes, keypoints and text polygons
take the same `Geometry.to_frame` / `points_to_frame` as the transform that made the
input, so a head never learns how its input was made (stretch, letterbox, crop, tile).
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_agent.heads.base import Detection, Result, TextBox
from edge_agent.vision.geometry import Geometry


def to_frame(results: Sequence[Result], geometry: Geometry) -> list[Result]:
    """`results` in frame pixels; results with no coordinates pass unchanged.

    A detection whose box lies wholly in the letterbox padding (or outside the part of
    the frame the model saw) has no area left once clipped, and is dropped.
    """
    out: list[Result] = []
    for result in results:
        if isinstance(result, Detection):
            x0, y0, x1, y1 = (float(v) for v in geometry.to_frame(result.box)[0])
            if x1 <= x0 or y1 <= y0:
                continue
            update: dict[str, object] = {"box": (x0, y0, x1, y1)}
            if result.keypoints:
                points = geometry.points_to_frame(result.keypoints)
                update["keypoints"] = tuple((float(x), float(y)) for x, y in points)
            out.append(result.model_copy(update=update))
        elif isinstance(result, TextBox):
            points = geometry.points_to_frame(result.polygon)
            out.append(
                result.model_copy(
                    update={"polygon": tuple((float(x), float(y)) for x, y in points)}
                )
            )
        else:
            out.append(result)
    return out
