"""The head registry: a manifest's `[head]` table picks its decoder by `type`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from edge_agent.heads.base import FrameHead
from edge_agent.heads.blazeface import BlazeFaceConfig, BlazeFaceHead
from edge_agent.heads.classification import ClassificationConfig, ClassificationHead
from edge_agent.heads.dbnet import DbnetConfig, DbnetHead
from edge_agent.heads.raw import RawConfig, RawHead
from edge_agent.heads.ssd import SsdConfig, SsdHead
from edge_agent.heads.vad import VadConfig
from edge_agent.heads.yolo import YoloConfig, YoloHead

HeadConfig = Annotated[
    SsdConfig
    | BlazeFaceConfig
    | ClassificationConfig
    | DbnetConfig
    | YoloConfig
    | VadConfig
    | RawConfig,
    Field(discriminator="type"),
]


def build_frame_head(config: HeadConfig) -> FrameHead:
    """Return the per-frame decoder for `config`.

    Raises:
        TypeError: the head is a streaming head (VAD), which carries state across
            chunks and is built by the audio runner instead.
    """
    match config:
        case SsdConfig():
            return SsdHead(config)
        case BlazeFaceConfig():
            return BlazeFaceHead(config)
        case ClassificationConfig():
            return ClassificationHead(config)
        case DbnetConfig():
            return DbnetHead(config)
        case YoloConfig():
            return YoloHead(config)
        case RawConfig():
            return RawHead(config)
        case VadConfig():
            raise TypeError("the VAD head is a streaming head; use the audio runner")
