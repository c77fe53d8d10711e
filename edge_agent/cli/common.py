"""What the commands share: the parser class, argument types, runtime arguments, the layout.

Imported by every command's `register`, so it stays light: argparse and the
standard library only at module level. The catalog, runtime and anything that
pulls in numpy or an engine are imported inside the functions that need them,
which keeps `edge-agent --help` fast and makes one broken command unable to
break the others.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from edge_agent.arg_types import positive_days as positive_days
from edge_agent.arg_types import positive_float as positive_float
from edge_agent.arg_types import positive_int as positive_int
from edge_agent.arg_types import topic_prefix as topic_prefix
from edge_agent.errors import EdgeAgentError
from edge_agent.paths import Layout

if TYPE_CHECKING:
    from edge_agent.catalog.catalog import Catalog
    from edge_agent.runtime.base import Hint, RuntimeOptions


class HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default after its help, when it has a meaningful one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "(default:" in text  # the help says it in words already
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class CliParser(argparse.ArgumentParser):
    """argparse with edge-agent's error style: one line on stderr, exit 2, no usage dump."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        print(
            f"edge-agent: error: {message}; see `{self.prog} --help` [input.invalid]",
            file=sys.stderr,
        )
        raise SystemExit(2)


DEVICE_HELP = (
    "CPU, GPU, NPU, AUTO, or a priority list such as GPU,CPU (tried in order; "
    "a device that cannot compile is reported and the next one used)"
)
BACKEND_HELP = "inference engine"
PRECISION_HELP = (
    "inference precision; unset keeps the device's own (bf16 on CPUs with AMX or "
    "AVX-512 BF16, f16 on GPU); a precision the device cannot run is reported"
)


def add_device_args(parser: argparse.ArgumentParser, default_hint: Hint) -> None:
    """--device, --backend, --hint and --precision, as every model-running command takes them."""
    parser.add_argument("--device", default="CPU", help=DEVICE_HELP)
    parser.add_argument(
        "--backend", default="openvino", choices=["openvino", "onnxruntime"], help=BACKEND_HELP
    )
    parser.add_argument(
        "--hint",
        choices=["latency", "throughput"],
        default=default_hint,
        help="OpenVINO performance hint: latency runs one request at a time, "
        "throughput as many in parallel as the device likes",
    )
    parser.add_argument(
        "--precision", choices=["f32", "bf16", "f16"], default=None, help=PRECISION_HELP
    )


def add_runtime_args(parser: argparse.ArgumentParser, default_hint: Hint) -> None:
    """--model, the device arguments and --no-cache: for `infer` and `bench`."""
    parser.add_argument(
        "--model",
        required=True,
        help="reference model name (see `edge-agent models list`) or a model file "
        "with its manifest (.toml) beside it",
    )
    add_device_args(parser, default_hint)
    parser.add_argument(
        "--no-cache", action="store_true", help="do not read or write compiled models in the cache"
    )


MAX_SHAPE_ELEMENTS = 1 << 28
"""The largest input a --shape may ask for: 268M elements, a GB of float32 a request."""


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """'1,3,640,640' -> (1, 3, 640, 640)."""
    if text is None:
        return None
    try:
        dims = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError:
        raise EdgeAgentError(
            f"bad shape {text!r}",
            "write it as comma-separated integers, e.g. 1,3,640,640",
            code="input.invalid",
        ) from None
    if any(d <= 0 for d in dims):
        raise EdgeAgentError(
            f"bad shape {text!r}", "every dimension must be positive", code="input.invalid"
        )
    if math.prod(dims) > MAX_SHAPE_ELEMENTS:
        # 1,99999,99999,3 is 30 GB a request: the engine's bad_alloc blamed the manifest.
        raise EdgeAgentError(
            f"shape {text!r} is {math.prod(dims):,} elements a request",
            f"pass a shape of at most {MAX_SHAPE_ELEMENTS:,} elements (a 4K frame is 25M)",
            code="input.invalid",
        )
    return dims


def layout(args: argparse.Namespace) -> Layout:
    """The cache and state folders: --cache-dir/--state-dir, else the environment's."""
    found = getattr(args, "layout", None)
    if isinstance(found, Layout):
        return found
    return Layout.from_env(
        os.environ, cache=getattr(args, "cache_dir", None), state=getattr(args, "state_dir", None)
    )


def catalog(args: argparse.Namespace) -> Catalog:
    from edge_agent.catalog.catalog import Catalog, default_models_dir
    from edge_agent.store.store import ModelStore

    # The store's current version of a name comes before the reference model of that name.
    where = layout(args)
    if args.models_dir is not None and not Path(args.models_dir).is_dir():
        raise EdgeAgentError(
            f"--models-dir {args.models_dir} is not a folder",
            "pass the folder of model manifests (*.toml), or leave it out for the built-in ones",
            code="input.not_found",
        )
    return Catalog(args.models_dir or default_models_dir(), where.cache, store=ModelStore(where))


def require_writable(path: Path, what: str, flag: str) -> None:
    """Refuse to start work whose output cannot be written, before any of it is done.

    Raises:
        EdgeAgentError: path.unwritable, naming the folder and the option that moves it.
    """
    from edge_agent.doctor import probe_writable

    problem = probe_writable(path)
    if problem is not None:
        raise EdgeAgentError(
            f"the {what} {path} is not writable: {problem}",
            f"fix its permissions, or point {flag} at a folder you can write",
            code="path.unwritable",
        )


def runtime_options(
    args: argparse.Namespace, shape: tuple[int, ...] | None = None
) -> RuntimeOptions:
    from edge_agent.runtime.base import RuntimeOptions

    return RuntimeOptions(
        device=args.device,
        hint=args.hint,
        precision=args.precision,
        cache_dir=None if args.no_cache else layout(args).cache,
        shape=shape,
    )
