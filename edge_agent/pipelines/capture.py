"""Capture sink: a reservoir sample of a pipeline's frames, kept on disk under a quota.

Calibration wants what this camera really sees, spread over hours, not the
first minute. Reservoir sampling (Algorithm R) keeps a uniform sample of every
frame offered so far in a fixed number of slots; frames are offered at most
every `min_interval_s` so near-identical neighbours don't crowd the sample.
A slot file is replaced atomically, and a byte quota stops the sink from
writing before the disk fills.

The sample survives restarts: the number of frames offered so far is kept in
`reservoir.json` beside the slots. Without it a restarted pipeline would treat
its full reservoir as a sample of a few frames and overwrite most of it within
minutes; with it, 200 new frames after 5,000 replace about 50 * 200 / 5,200 = 2
slots, as a uniform sample of all 5,200 should.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Literal

import cv2
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.logs import error_text, log_event
from edge_agent.pipelines.base import FrameResult

log = logging.getLogger(__name__)

STATE_FILE = "reservoir.json"

SAVE_EVERY = 100
"""Offers between two saves of the count: a crash forgets at most these, which biases a
sample of thousands by a few percent at worst, at one small fsync per 100 offers."""


class CaptureSinkSpec(BaseModel):
    """Keep a uniform sample of frames for on-device calibration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["capture"] = Field(default="capture", description="Sink selector.")
    folder: Path | None = Field(
        default=None,
        description="Where to keep frames; None: the pipeline's captures folder in the state dir.",
    )
    frames: int = Field(default=300, ge=1, le=100_000, description="Reservoir size.")
    min_interval_s: float = Field(
        default=0.5, ge=0.0, description="Offer at most one frame per this much stream time."
    )
    max_mb: float = Field(default=200.0, gt=0, description="Quota for the folder, in MB.")
    seed: int | None = Field(default=None, description="Random seed, for reproducible tests.")


class CaptureSink:
    """Sink that keeps a reservoir sample of frames as JPEG files.

    Raises (from `emit` and `close`): OSError when the folder cannot be written;
    the pipeline's guard counts it and the sample carries on with the next frame.
    """

    def __init__(self, spec: CaptureSinkSpec, folder: Path) -> None:
        self.spec = spec
        self.folder = folder
        self.kept = 0
        self.over_quota = 0
        self._last_ts: float | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self._drop_slots_from(spec.frames)
        # Resume: a restarted pipeline keeps filling the sample it had.
        self._slots = min(len(list(folder.glob("slot-*.jpg"))), spec.frames)
        self._size = spec.frames
        """Slots the sample has: `frames`, or fewer once the quota was reached filling them."""
        self.offered = self._load_offered()
        self._saved = self.offered
        # A fixed seed must not replay the first run's draws after a restart.
        resumed = spec.seed is not None and self.offered > 0
        self._random = random.Random(f"{spec.seed}:{self.offered}" if resumed else spec.seed)

    def emit(self, result: FrameResult) -> None:
        """Offer the frame to the reservoir, if enough stream time has passed."""
        if result.image is None or result.frame < 0:
            return
        if self._last_ts is not None and result.ts - self._last_ts < self.spec.min_interval_s:
            return
        self._last_ts = result.ts
        self.offered += 1
        if self._slots < self._size:
            # Filling: the next free slot, taken only once its file is there. Taken before,
            # a write the disk refused left a hole, and after a restart, which counts the
            # files, the next frame replaced the last slot's instead.
            refused = self.over_quota
            if self._write(self._slots, result):
                self._slots += 1
            elif self.over_quota > refused and self._slots:
                # The quota holds no more than these: the sample is these slots from now
                # on, their frames replaced at random as any full sample's. Left filling,
                # every later frame was refused for the same slot and the sample stayed
                # the stream's first minute.
                self._size = self._slots
        else:
            pick = self._random.randrange(self.offered)
            if pick < self._size:
                self._write(pick, result)
        if self.offered - self._saved >= SAVE_EVERY:
            self._save()

    def close(self) -> None:
        """Save the count of frames offered, so the next run resumes the sample."""
        if self.offered != self._saved:
            self._save()

    def _drop_slots_from(self, first: int) -> None:
        """Delete the slots numbered `first` and above: a run with more `frames` filled them.

        Kept, they were never replaced, counted against the quota for good, and calibration
        read them beside the sample: stale frames, no longer a uniform one.
        """
        for path in self.folder.glob("slot-*.jpg"):
            number = path.stem.removeprefix("slot-")
            if number.isdigit() and int(number) >= first:
                path.unlink(missing_ok=True)

    def _load_offered(self) -> int:
        path = self.folder / STATE_FILE
        try:
            offered = int(json.loads(path.read_text(encoding="utf-8"))["offered"])
        except FileNotFoundError:
            if self._slots:
                # Slots from a version that kept no count: the least it can have been.
                log_event(log, logging.INFO, "capture_count_missing", folder=str(self.folder))
            return self._slots
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log_event(
                log,
                logging.WARNING,
                "capture_count_unreadable",
                folder=str(self.folder),
                error=error_text(exc),
            )
            return self._slots
        return max(offered, self._slots)

    def _save(self) -> None:
        path = self.folder / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump({"offered": self.offered, "frames": self.spec.frames}, f)
            f.flush()
            # Edge boxes lose power; without fsync the rename can outlive the data.
            os.fsync(f.fileno())
        tmp.replace(path)
        self._saved = self.offered

    def _write(self, slot: int, result: FrameResult) -> bool:
        """Write the frame to its slot; whether it was (not over the quota, encoded)."""
        assert result.image is not None
        ok, data = cv2.imencode(".jpg", result.image, [cv2.IMWRITE_JPEG_QUALITY, 95])
        if not ok:
            return False
        target = self.folder / f"slot-{slot:05d}.jpg"
        used = sum(p.stat().st_size for p in self.folder.glob("slot-*.jpg") if p != target)
        if used + len(data) > self.spec.max_mb * 1e6:
            self.over_quota += 1
            if self.over_quota == 1:
                log_event(
                    log,
                    logging.WARNING,
                    "capture_quota_reached",
                    pipeline=result.pipeline,
                    folder=str(self.folder),
                    max_mb=self.spec.max_mb,
                )
            return False
        tmp = target.with_suffix(".tmp")
        try:
            tmp.write_bytes(data.tobytes())
            tmp.replace(target)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        self.kept += 1
        return True
