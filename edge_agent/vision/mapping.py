"""Heads' results, decoded in model-input pixels, mapped back to frame pixels.

The one inverse every head's results go through: boxes, keypoints and text polygons
take the same `Geometry.to_frame` / `points_to_frame` as the transform that made the
input, so a head never learns how its input was made (stretch, letterbox, crop, tile).
`to_camera` is the last step out of a pipeline: a frame decoded at a reduced JPEG scale
has its results multiplied back into the camera's own pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edge_agent.heads.base import Detection, Result, TextBox
from edge_agent.vision.geometry import Geometry


def to_frame(results: Sequence[Result], geometry: Geometry) -> list[Result]:
    """`results` in frame pixels; results with no coordinates pass unchanged.

    A detection whose box lies wholly in the letterbox padding (or outside the part of
    the frame the model saw) has no area left once clipped, and is dropped; so is a text
    polygon, whose points are clipped the same way (DBNet's unclip grows a line near the
    picture's edge into the padding: its points left the frame). A box or polygon with a
    NaN coordinate (an overflowing model) is dropped too: NaN fails every comparison, so
    each check is written to pass only real, positive sizes.
    """
    out: list[Result] = []
    for result in results:
        if isinstance(result, Detection):
            x0, y0, x1, y1 = geometry.box_to_frame(result.box)
            if not (x1 > x0 and y1 > y0):
                continue
            update: dict[str, object] = {"box": (x0, y0, x1, y1)}
            if result.keypoints:
                points = geometry.points_to_frame(result.keypoints)
                update["keypoints"] = tuple((float(x), float(y)) for x, y in points)
            out.append(result.model_copy(update=update))
        elif isinstance(result, TextBox):
            s = geometry.source
            points = np.clip(geometry.points_to_frame(result.polygon), s[:2], s[2:])
            xs, ys = points[:, 0], points[:, 1]
            if not (xs.max() > xs.min() and ys.max() > ys.min()):
                continue
            out.append(
                result.model_copy(
                    update={"polygon": tuple((float(x), float(y)) for x, y in points)}
                )
            )
        else:
            out.append(result)
    return out


def to_camera(results: Sequence[Result], scale: int) -> list[Result]:
    """`results` (frame pixels of a frame decoded at 1/`scale`) in the camera's pixels."""
    if scale == 1:
        return list(results)
    out: list[Result] = []
    for result in results:
        if isinstance(result, Detection):
            update: dict[str, object] = {"box": tuple(float(v) * scale for v in result.box)}
            if result.keypoints:
                update["keypoints"] = tuple((x * scale, y * scale) for x, y in result.keypoints)
            out.append(result.model_copy(update=update))
        elif isinstance(result, TextBox):
            polygon = tuple((x * scale, y * scale) for x, y in result.polygon)
            out.append(result.model_copy(update={"polygon": polygon}))
        else:
            out.append(result)
    return out
