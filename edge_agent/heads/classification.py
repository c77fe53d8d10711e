"""Top-k classification head."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.heads.base import Classification, Outputs, Result, pick


class ClassificationConfig(BaseModel):
    """Which output holds the scores, and what they mean."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["classification"] = Field(default="classification", description="Head selector.")
    output: str = Field(description="[1,C] scores or logits.")
    labels: list[str] = Field(min_length=1, description="Class names, by index.")
    top_k: int = Field(default=1, ge=1, description="How many classes to report.")
    softmax: bool = Field(
        default=True,
        description="Apply softmax; false when the model already outputs probabilities.",
    )


def top_k(scores: np.ndarray, k: int, labels: list[str], softmax: bool) -> list[Classification]:
    """Return the k best classes of one image's score vector, best first."""
    x = scores.reshape(-1).astype(np.float64)
    if softmax:
        e = np.exp(x - x.max())
        x = e / e.sum()
    k = min(k, x.size)
    # argpartition is O(C); only the k survivors are sorted.
    best = np.argpartition(-x, k - 1)[:k]
    best = best[np.argsort(-x[best], kind="stable")]
    return [
        Classification(
            label=labels[i] if i < len(labels) else str(i), class_id=int(i), score=float(x[i])
        )
        for i in best
    ]


class ClassificationHead:
    """FrameHead for `ClassificationConfig`."""

    def __init__(self, config: ClassificationConfig) -> None:
        self.config = config

    def decode(self, outputs: Outputs, input_size: tuple[int, int]) -> list[Result]:
        c = self.config
        return list(top_k(pick(outputs, c.output)[0], c.top_k, c.labels, c.softmax))
