"""Capture sink: a reservoir sample of a pipeline's frames, kept on disk under a quota.

Calibration wants what this camera really sees, spread over hours, not the
first minute. Reservoir sampling (Algorithm R) keeps a uniform sample of every
frame offered so far in a fixed number of slots; frames are offered at most
every `min_interval_s` so near-identical neighbours don't crowd the sample.
A slot file is replaced atomically, and a byte quota stops the sink from
writing before the disk fills.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Literal

import cv2
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.pipelines.base import FrameResult

log = logging.getLogger(__name__)


def capture_folder(cache: Path, pipeline: str) -> Path:
    """Where pipeline `pipeline` keeps its captured frames by default."""
    return cache / "captures" / pipeline


class CaptureSinkSpec(BaseModel):
    """Keep a uniform sample of frames for on-device calibration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["capture"] = Field(default="capture", description="Sink selector.")
    folder: Path | None = Field(
        default=None, description="Where to keep frames; None: <cache>/captures/<pipeline id>."
    )
    frames: int = Field(default=300, ge=1, le=100_000, description="Reservoir size.")
    min_interval_s: float = Field(
        default=0.5, ge=0.0, description="Offer at most one frame per this much stream time."
    )
    max_mb: float = Field(default=200.0, gt=0, description="Quota for the folder, in MB.")
    seed: int | None = Field(default=None, description="Random seed, for reproducible tests.")


class CaptureSink:
    """Sink that keeps a reservoir sample of frames as JPEG files."""

    def __init__(self, spec: CaptureSinkSpec, folder: Path) -> None:
        self.spec = spec
        self.folder = folder
        self.offered = 0
        self.kept = 0
        self.over_quota = 0
        self._random = random.Random(spec.seed)
        self._last_ts: float | None = None
        folder.mkdir(parents=True, exist_ok=True)
        # Resume: a restarted pipeline keeps filling the sample it had.
        self._slots = len(list(folder.glob("slot-*.jpg")))

    def emit(self, result: FrameResult) -> None:
        if result.image is None or result.frame < 0:
            return
        if self._last_ts is not None and result.ts - self._last_ts < self.spec.min_interval_s:
            return
        self._last_ts = result.ts
        self.offered += 1
        if self._slots < self.spec.frames:
            slot = self._slots
            self._slots += 1
        else:
            pick = self._random.randrange(self.offered)
            if pick >= self.spec.frames:
                return
            slot = pick
        self._write(slot, result)

    def _write(self, slot: int, result: FrameResult) -> None:
        assert result.image is not None
        ok, data = cv2.imencode(".jpg", result.image, [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            return
        target = self.folder / f"slot-{slot:05d}.jpg"
        used = sum(p.stat().st_size for p in self.folder.glob("slot-*.jpg") if p != target)
        if used + len(data) > self.spec.max_mb * 1e6:
            self.over_quota += 1
            if self.over_quota == 1:
                log.warning(
                    "capture=%s event=quota_reached folder=%s", result.pipeline, self.folder
                )
            return
        tmp = target.with_suffix(".tmp")
        try:
            tmp.write_bytes(data.tobytes())
            tmp.replace(target)
            self.kept += 1
        except OSError as exc:
            log.warning("capture=%s event=write_failed detail=%s", result.pipeline, exc)

    def close(self) -> None:
        pass
