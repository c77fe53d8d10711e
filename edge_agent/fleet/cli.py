"""`edge-fleet`: the reference fleet console (this issue: keygen, publish-model, serve).

Broker flags follow mosquitto_sub (-h -p -u -P --cafile) or --broker URL, so
`-h` is the host here, as there; help is `--help`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.arg_types import mirror_url, positive_days, positive_int, topic_prefix
from edge_agent.comms.cli_args import add_broker_args, broker_settings
from edge_agent.errors import EdgeAgentError, from_os_error
from edge_agent.fleet.console_cmd import add_console_verbs
from edge_agent.paths import default_fleet_repo
from edge_agent.protocol.topics import DEFAULT_PREFIX, DEFAULT_SHARE_GROUP, Topics

if TYPE_CHECKING:
    from paho.mqtt.reasoncodes import ReasonCode

    from edge_agent.store.release import Release

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        print(
            f"edge-fleet: error: {message}; see `{self.prog} --help` [input.invalid]",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_USER_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edge-fleet",
        description="Publish models to a fleet, serve them, and command its devices.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v INFO, -vv DEBUG")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    keygen = verbs.add_parser("keygen", help="make an Ed25519 key pair (PEM)")
    keygen.add_argument("out", type=Path, help="private key path; the public key is OUT.pub")
    keygen.set_defaults(run=run_keygen)

    def with_broker(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = verbs.add_parser(name, help=help_text, add_help=False)
        sub.add_argument("--help", action="help", help="show this help and exit")
        add_broker_args(sub)
        sub.add_argument(
            "--prefix",
            type=topic_prefix,
            default=DEFAULT_PREFIX,
            help=f"topic prefix (default: {DEFAULT_PREFIX})",
        )
        sub.add_argument(
            "--repo",
            type=Path,
            default=None,
            help="published releases (default: $EDGE_FLEET_REPO, else XDG data/edge-fleet)",
        )
        return sub

    publish = with_broker("publish-model", "sign a model file and publish its release")
    publish.add_argument("file", type=Path, help="model file; its manifest is <stem>.toml beside")
    publish.add_argument("--name", help="model name (default: the manifest's)")
    publish.add_argument(
        "--version", type=positive_int, required=True, help="release version (>= 1)"
    )
    publish.add_argument("--key", type=Path, required=True, help="private key PEM")
    publish.add_argument("--manifest", type=Path, help="manifest TOML, if not beside FILE")
    publish.add_argument(
        "--precision",
        choices=["f32", "f16", "bf16", "int8", "int4", "mixed"],
        help=(
            "the weights' precision, as the release states it "
            "(default: int8 when the manifest says the model is quantized, else f32)"
        ),
    )
    publish.add_argument(
        "--chunk-kib",
        type=int,
        default=128,
        choices=[64, 96, 128],
        help="size of each broadcast chunk (default: %(default)s)",
    )
    publish.add_argument(
        "--expires-days",
        type=positive_days,
        default=30.0,
        help="release lifetime: devices refuse it after this (default: %(default)g)",
    )
    publish.add_argument(
        "--url-base",
        type=mirror_url,
        metavar="URL",
        help=(
            "a mirror that serves the files as URL/<file name>: boxes download them from "
            "it (HTTP Range, resumed) and take over MQTT whatever it fails to give"
        ),
    )
    publish.set_defaults(run=run_publish)

    serve = with_broker("serve", "answer repairs and pace broadcasts (run several)")
    serve.add_argument("--instance", default=None, help="instance id (default: random)")
    serve.add_argument(
        "--share-group",
        default=DEFAULT_SHARE_GROUP,
        help=f"$share group (default: {DEFAULT_SHARE_GROUP})",
    )
    serve.add_argument(
        "--window",
        type=positive_int,
        default=4,
        help="frames a puller may lag (default: %(default)s)",
    )
    serve.add_argument(
        "--own-topics-only",
        action="store_true",
        help="hear boxes only on their own delivery topics, not on the fleet-wide ones "
        "boxes of earlier builds send on (docs/PROTOCOL.md, 'Own topics')",
    )
    serve.set_defaults(run=run_serve)

    add_console_verbs(verbs)  # cmd, deploy, status, watch (fleet/console_cmd.py)
    return parser


def _repo(args: argparse.Namespace) -> Any:
    from edge_agent.fleet.repo import Repo

    return Repo(args.repo or default_fleet_repo(os.environ))


def run_keygen(args: argparse.Namespace) -> int:
    from edge_agent.store.release import (
        generate_key,
        key_id,
        save_private_key,
        save_public_key,
    )

    public_path = args.out.with_name(args.out.name + ".pub")
    if args.out.exists():
        raise EdgeAgentError(
            f"{args.out} exists",
            "choose another path; keys are never overwritten",
            code="input.invalid",
        )
    key = generate_key()
    save_private_key(key, args.out)
    save_public_key(key.public_key(), public_path)
    print(f"private key {args.out} (0600), public key {public_path}, id {key_id(key.public_key())}")
    return 0


def run_publish(args: argparse.Namespace) -> int:
    from edge_agent.comms.session import connect
    from edge_agent.fleet.publish import publish_release, release_for_file
    from edge_agent.store.release import load_private_key

    if args.version < 1:
        raise EdgeAgentError("--version must be 1 or more", code="input.invalid")
    signed = release_for_file(
        args.file,
        name=args.name,
        version=args.version,
        key=load_private_key(args.key),
        manifest_path=args.manifest,
        precision=args.precision,
        chunk_size=args.chunk_kib * 1024,
        lifetime=timedelta(days=args.expires_days),
        url_base=args.url_base,
    )
    session = connect(broker_settings(args))
    repo = _repo(args)
    try:
        # The repository first, then the broker: a box that sees the release pulls it at
        # once, and a server must hold it by then. MQTT cannot ask whether a publish would
        # be refused without making it, so a refusal leaves the release in the repository.
        publish_release(session, Topics(args.prefix), repo, signed, args.file.parent)
        if not session.flush(30.0):
            raise EdgeAgentError(
                "the broker did not acknowledge the release within 30 s",
                "check the broker; publishing again is safe",
                code="broker.unreachable",
            )
        if session.last_refusal is not None:
            user = session.settings.username
            raise _refused(
                session.last_refusal, user, Topics(args.prefix), repo.root, signed.release
            )
    finally:
        session.stop()
    release = signed.release
    print(
        f"published {release.name} v{release.version} ({release.total_size} bytes, "
        f"{sum(len(f.chunks) for f in release.files)} chunks, key {release.key_id})"
    )
    return 0


def _refused(
    reason: ReasonCode, user: str | None, topics: Topics, repo: Path, release: Release
) -> EdgeAgentError:
    """The error for a release an MQTT 5 broker acknowledged and refused, in its words.

    Said as the broker says it: "user X may not publish" blamed the ACL for a refusal of
    any kind (a quota, a packet too large). Said at all: "published" was printed for a
    release no box can see.
    """
    where = topics.release(release.name, release.version).rsplit("/", 1)[0] + "/"
    if reason.getName() == "Not authorized":
        fix = (
            f"publish it again as a user the broker lets write {where}# (the fleet's "
            "console user, `fleet` in systemd/mosquitto/fleet.acl)"
        )
    else:
        fix = "the broker's log says why; publish it again once that is fixed"
    return EdgeAgentError(
        f"the broker refused the release on {where}: {reason.getName()} (reason code "
        f"{reason.value}, user {user or 'anonymous'}); the fleet's repository {repo} holds "
        f"{release.name} v{release.version} now, but no box can see it",
        f"{fix} (the same file again is safe)",
        code="error",
    )


def run_serve(args: argparse.Namespace) -> int:
    from edge_agent.delivery.broadcast import BroadcastOptions
    from edge_agent.fleet.server import FleetServer
    from edge_agent.fleet.server_session import connect_server

    topics = Topics(args.prefix)
    instance = args.instance or f"serve-{uuid.uuid4().hex[:8]}"
    # A server may start before its broker (boot, compose): it waits, a command fails fast.
    session, started = connect_server(broker_settings(args), topics, instance, fail_fast=False)
    server = FleetServer(
        session,
        _repo(args),
        instance=instance,
        topics=topics,
        share_group=args.share_group,
        options=BroadcastOptions(window=args.window),
        shared_topics=not args.own_topics_only,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    started(server)
    print(f"edge-fleet serve {instance}: ready", flush=True)
    try:
        server.run(stop)
    finally:
        server.close()
        session.flush(2.0)
        session.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from edge_agent.logs import setup_logging

    setup_logging(args.verbose, "kv", sys.stderr)
    try:
        code: int = args.run(args)
    except BrokenPipeError:
        return 141  # the reader of stdout went away (`| head`): nothing to say
    except (EdgeAgentError, OSError) as caught:
        exc = caught if isinstance(caught, EdgeAgentError) else from_os_error(caught)
        print(f"edge-fleet: error: {exc} [{exc.code}]", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
