"""Raw-tensor head for models the agent does not know: a summary per output."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.heads.base import Outputs, Result, TensorSummary


class RawConfig(BaseModel):
    """No settings: every output is summarised."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["raw"] = Field(default="raw", description="Head selector.")


def summarise(name: str, tensor: np.ndarray) -> TensorSummary:
    """Shape, type and simple statistics of one output."""
    flat = tensor.reshape(-1).astype(np.float64)
    empty = flat.size == 0
    return TensorSummary(
        name=name,
        shape=tuple(int(d) for d in tensor.shape),
        dtype=str(tensor.dtype),
        min=0.0 if empty else float(flat.min()),
        max=0.0 if empty else float(flat.max()),
        mean=0.0 if empty else float(flat.mean()),
        argmax=0 if empty else int(flat.argmax()),
    )


class RawHead:
    """FrameHead for `RawConfig`."""

    def __init__(self, config: RawConfig) -> None:
        self.config = config

    def decode(self, outputs: Outputs, input_size: tuple[int, int]) -> list[Result]:
        # Backends key one tensor under each of its names; report each tensor once.
        seen: set[int] = set()
        found: list[Result] = []
        for name, tensor in sorted(outputs.items()):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            found.append(summarise(name, np.asarray(tensor)))
        return found
