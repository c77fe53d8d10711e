"""Argument parsing shared by the commands that load a model."""

from __future__ import annotations

import argparse
from pathlib import Path

from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.base import RuntimeOptions


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="reference model name or model file path")
    parser.add_argument(
        "--device", default="CPU", help="CPU, GPU, NPU, AUTO or a priority list like GPU,CPU"
    )
    parser.add_argument("--backend", default="openvino", choices=["openvino", "onnxruntime"])
    parser.add_argument(
        "--precision",
        choices=["f32", "bf16", "f16"],
        default=None,
        help="inference precision (default: the device's own; bf16 on CPUs that have it)",
    )
    parser.add_argument("--hint", choices=["latency", "throughput"], default=None)
    parser.add_argument(
        "--no-cache", action="store_true", help="do not read or write the model cache"
    )


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """'1,3,640,640' -> (1, 3, 640, 640)."""
    if text is None:
        return None
    try:
        dims = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError:
        raise EdgeAgentError(
            f"bad shape {text!r}", "write it as comma-separated integers, e.g. 1,3,640,640"
        ) from None
    if any(d <= 0 for d in dims):
        raise EdgeAgentError(f"bad shape {text!r}", "every dimension must be positive")
    return dims


def catalog(args: argparse.Namespace) -> Catalog:
    return Catalog(args.models_dir or default_models_dir(), Path(args.cache_dir))


def runtime_options(
    args: argparse.Namespace, default_hint: str, shape: tuple[int, ...] | None = None
) -> RuntimeOptions:
    return RuntimeOptions(
        device=args.device,
        hint=args.hint or default_hint,
        precision=args.precision,
        cache_dir=None if args.no_cache else Path(args.cache_dir),
        shape=shape,
    )
