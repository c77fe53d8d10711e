"""`edge-agent infer`: decode one image or WAV file, as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edge_agent.cli.common import (
    add_runtime_args,
    catalog,
    layout,
    require_writable,
    runtime_options,
)


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "infer",
        help="run a model on an image or WAV file and print JSON lines of results",
        description="Run a model on one file. stdout: one JSON line per result; stderr: "
        "where and how the model was compiled, as one JSON line.",
    )
    add_runtime_args(parser, default_hint="latency")
    parser.add_argument(
        "--input",
        required=True,
        type=Path,
        help="one image (any format OpenCV reads) or .wav file; for a folder or video "
        "use run-pipeline",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edge_agent.infer import infer_input, read_input
    from edge_agent.runtime import create_backend

    require_writable(layout(args).cache, "model cache", "--cache-dir")
    resolved = catalog(args).resolve(args.model)
    data = read_input(resolved.manifest, args.input)
    backend = create_backend(args.backend)
    with backend.compile(resolved.path, resolved.manifest, runtime_options(args)) as model:
        # Decoded before anything is printed: a head that cannot read the model's outputs
        # (a manifest naming an output it lacks) is then the one error line, not a
        # compile line followed by one.
        results = list(infer_input(model, resolved.manifest, data))
        # Where it ran, and any fallback, goes to stderr so stdout stays pure results.
        report = model.report
        print(json.dumps({"compile": report.model_dump(mode="json")}), file=sys.stderr)
        for result in results:
            print(json.dumps(result.model_dump(mode="json")))
    return 0
