"""`pull`: bring a published release into this box's store, resuming, then verify it.

This is what `edge-agent models pull` runs and what the agent's `deploy_model`
command calls: find the signed release (retained on its topic), check it
against the trusted keys and the installed versions, fill in a resumable
partial transfer (URLs first, then MQTT broadcast and repair), hand the files
to `ModelStore.install` (which hashes the bytes it keeps: the runtime loads
exactly the verified bytes), and activate behind the health gate if asked.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge_agent.comms.base import Communicator, Message
from edge_agent.delivery.chunks import release_id
from edge_agent.delivery.partial import PartialTransfer, sweep
from edge_agent.delivery.puller import Puller, PullerOptions, PullStats
from edge_agent.delivery.urls import UrlFetch
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_event
from edge_agent.paths import Layout, is_safe_name
from edge_agent.protocol.topics import Topics
from edge_agent.store.release import (
    Release,
    SignedRelease,
    parse_signed_release,
    same_content,
    verify,
)
from edge_agent.store.store import Gate, ModelStore

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, float], None]
"""(stage, fraction of the whole pull): stages release, transfer, install, activate."""


@dataclass(frozen=True, slots=True)
class PullOptions:
    release_timeout_s: float = 10.0
    """How long to wait for the retained release message."""
    stall_s: float = 300.0
    """Give up when no chunk arrived for this long (the partial stays for a resume)."""
    url_timeout_s: float = 30.0
    keep_free_bytes: int = 64 * 1024 * 1024
    """Left free on the state disk after the pull: the outbox, the records and the
    command log live there too, and a box whose state disk fills stops remembering."""
    puller: PullerOptions = field(default_factory=PullerOptions)


@dataclass(frozen=True, slots=True)
class PullResult:
    release: Release
    installed: bool
    """False when that version was already in the store (nothing was transferred)."""
    activated: bool
    chunks: int
    stats: PullStats


def fetch_release(
    comm: Communicator, topics: Topics, name: str, version: int | None, timeout_s: float
) -> SignedRelease:
    """The retained signed release of `name` (a version, or the latest).

    Raises:
        EdgeAgentError: store.path, transfer.failed (none published), release.invalid.
    """
    if not is_safe_name(name):
        raise EdgeAgentError(f"model name {name!r} is not a safe store name", code="store.path")
    topic = topics.release(name, version) if version else topics.release_latest(name)
    got: queue.Queue[Message] = queue.Queue()
    unsubscribe = comm.subscribe(topic, got.put, qos=1)
    try:
        while True:
            message = got.get(timeout=timeout_s)
            if message.payload:
                return parse_signed_release(message.payload)
    except queue.Empty:
        raise EdgeAgentError(
            f"no release of {name}{f' v{version}' if version else ''} is published "
            f"(nothing retained on {topic} within {timeout_s:g} s)",
            "publish it with `edge-fleet publish-model`, or check --broker and the topic prefix",
            code="transfer.failed",
        ) from None
    finally:
        unsubscribe()


def pull(
    comm: Communicator,
    store: ModelStore,
    layout: Layout,
    name: str,
    *,
    device_id: str,
    version: int | None = None,
    trusted_keys: Sequence[Ed25519PublicKey] = (),
    topics: Topics | None = None,
    activate: bool = False,
    gate: Gate | None = None,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    commit: Callable[[], None] | None = None,
    options: PullOptions | None = None,
) -> PullResult:
    """Pull `name` (v`version`, or the latest) into the store.

    `commit` is called right before the store changes (install, activate): it raises
    command.cancelled when cancel came first, and after it a cancel is too late.

    Raises:
        EdgeAgentError: release.* (rejected; release.conflict when this box holds other
            bytes under that name and version), transfer.failed, transfer.digest,
            command.cancelled, store.*, health.failed (with --activate); path.unwritable
            when the state disk cannot hold the release before it starts (one that fills
            during the transfer is transfer.failed, its partial removed).
    """
    topics = topics or Topics()
    options = options or PullOptions()
    report = progress or (lambda stage, fraction: None)
    commit = commit or (lambda: None)
    report("release", 0.0)
    signed = fetch_release(comm, topics, name, version, options.release_timeout_s)
    release = signed.release
    if release.name != name:
        raise EdgeAgentError(
            f"the release on {name}'s topic is for {release.name!r}", code="release.invalid"
        )
    installed = store.installed(name, release.version)
    if installed is not None:
        if not same_content(installed, release):
            # Taken for installed, the fleet's release "deployed" ok with none of its bytes
            # on the box: a version `calibrate` built here (unsigned) answered for it.
            made_here = store.release(name, release.version).signature is None
            raise EdgeAgentError(
                f"{name} v{release.version} on this box is not the release on the broker "
                + ("(it was built on this box, by calibrate)" if made_here else "(other files)"),
                f"publish it as v{store.state(name).highest + 1} or higher, or remove "
                f"{name} v{release.version} from this box first",
                "release.conflict",
            )
        # The same bytes as a version the store verified say nothing of who sent this
        # copy: an unsigned or expired one, or an old signed one replayed on `latest`,
        # turned a deploy of the newest into a rollback to a version the box still held.
        verify(signed, trusted_keys, datetime.now(UTC), None)
        current = store.state(name).current
        if version is None and current is not None and release.version < current:
            raise EdgeAgentError(
                f"the newest release of {name} on the broker is v{release.version}, older "
                f"than v{current}, which serves here; it is not taken for the newest",
                "to go back, send rollback_model or activate_model (or deploy_model with "
                "that version); to go forward, publish a higher version",
                "release.rollback",
            )
        log_event(log, logging.INFO, "pull_already_installed", model=name, version=release.version)
        activated = _activate(store, release, activate, gate, report, commit)
        return PullResult(release, False, activated, 0, PullStats())
    highest = store.state(name).highest
    verify(signed, trusted_keys, datetime.now(UTC), highest or None)
    folder = layout.transfers / f"{name}-{release.version}-{release_id(release)}"
    sweep(layout.transfers, keep=folder)
    _check_room(release, folder, store.root, options.keep_free_bytes)
    partial = _open_partial(folder, signed)
    try:
        stats = _transfer(comm, topics, device_id, partial, options, report, cancel)
        files = partial.finish()
        report("install", 0.9)
        commit()
        store.install(signed, files, trusted_keys=trusted_keys, link=True)
    except EdgeAgentError as exc:
        if exc.code == "transfer.digest":
            # Every chunk kept was checked against its hash, so a whole file that does not
            # hash right is a release whose chunks and file disagree: no resume mends it.
            partial.discard()
        elif _out_of_space(exc):
            # Kept for a resume, it held the disk at 100% (the outbox and the store on it)
            # until a deploy of that name or ABANDONED_S, 14 days.
            partial.discard()
            raise _removed_for_room(exc) from exc
        raise
    finally:
        partial.close()  # idempotent; an unexpected error must not leak a descriptor per file
    partial.discard()
    activated = _activate(store, release, activate, gate, report, commit)
    report("done", 1.0)
    return PullResult(release, True, activated, partial.count, stats)


def _open_partial(folder: Path, signed: SignedRelease) -> PartialTransfer:
    """The partial transfer in `folder`, created or resumed.

    Raises:
        EdgeAgentError: transfer.failed when the state disk will not take it.
    """
    try:
        return PartialTransfer(folder, signed)
    except OSError as exc:
        error = EdgeAgentError(
            f"cannot keep the transfer of {signed.release.name} in {folder}: {exc.strerror or exc}",
            "check the state disk is mounted read-write and has room, then deploy again",
            code="transfer.failed",
        )
        if _no_room(exc):
            shutil.rmtree(folder, ignore_errors=True)  # as a transfer that fills the disk
            error = _removed_for_room(error)
        raise error from exc


def _removed_for_room(exc: EdgeAgentError) -> EdgeAgentError:
    """`exc` once its partial transfer was removed for a full disk, saying so in its fix."""
    return EdgeAgentError(
        exc.problem,
        "free space on the state disk, then deploy again (the partial transfer was removed, "
        "so that the disk is not left full)",
        code=exc.code,
    )


def _check_room(release: Release, folder: Path, store_root: Path, keep_free_bytes: int) -> None:
    """Refuse a pull the disks cannot take, before any of it is transferred.

    The transfer needs what it has yet to receive (its files are sparse: a resumed one holds
    some blocks already); the store then links the files in, on the same file system, and
    copies them across to another.

    Raises:
        EdgeAgentError: path.unwritable, with the numbers.
    """
    transfers = _existing(folder)
    try:
        # A file that shares the store's inode (an install of it that failed) is copied
        # before it is written: held by the store, not by the transfer.
        found = [f.stat() for f in (folder / "files").rglob("*") if f.is_file()]
        held = sum(f.st_blocks * 512 for f in found if f.st_nlink == 1)
    except OSError:
        held = 0
    needs = [(transfers, max(0, release.total_size - held))]
    store = _existing(store_root)
    if store.stat().st_dev != transfers.stat().st_dev:
        needs.append((store, release.total_size))
    for where, size in needs:
        stat = os.statvfs(where)
        free = stat.f_bavail * stat.f_frsize
        if size + keep_free_bytes > free:
            raise EdgeAgentError(
                f"{release.name} v{release.version} needs {_mb(size)} on the disk of {where} "
                f"and {_mb(keep_free_bytes)} left free there, but {_mb(free)} is free",
                "free space on that disk (remove_model drops versions no longer needed), "
                "then deploy again",
                code="path.unwritable",
            )


def _existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists (what statvfs can be asked about)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _out_of_space(exc: EdgeAgentError) -> bool:
    """Whether a pull failed for a disk with no room (or a file it may not grow): no resume
    can finish there."""
    return _no_room(exc.__cause__)


def _no_room(exc: BaseException | None) -> bool:
    """Whether `exc` is the disk refusing to grow a file."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _activate(
    store: ModelStore,
    release: Release,
    activate: bool,
    gate: Gate | None,
    report: ProgressFn,
    commit: Callable[[], None],
) -> bool:
    if not activate:
        return False
    commit()  # before the stage is told: a console that sees "activate" knows it is final
    report("activate", 0.95)
    store.activate(release.name, release.version, gate)
    return True


def _transfer(
    comm: Communicator,
    topics: Topics,
    device_id: str,
    partial: PartialTransfer,
    options: PullOptions,
    report: ProgressFn,
    cancel: threading.Event | None,
) -> PullStats:
    count = max(1, partial.count)

    def chunk_done() -> None:
        report("transfer", 0.85 * partial.received / count)

    chunk_done()
    from_url = _from_urls(partial, options, cancel, chunk_done)
    puller = Puller(comm, topics, device_id, partial, options=options.puller)
    if partial.complete:
        return puller.stats
    puller.start()
    try:
        if not _watch(puller.done, partial, options, cancel, chunk_done, puller):
            raise EdgeAgentError(
                f"no chunk of {partial.chunks.release.name} arrived for "
                f"{options.stall_s:g} s ({partial.received}/{partial.count} chunks)"
                + (f"; before that, {from_url.problem}" if from_url else ""),
                "check the broker and that `edge-fleet serve` runs; pull again to resume",
                code="transfer.failed",
            )
    finally:
        puller.stop()
    if puller.error is not None:
        if from_url is not None:
            raise EdgeAgentError(
                f"{from_url.problem}; and over MQTT: {puller.error.problem}",
                puller.error.fix,
                code=puller.error.code,
            ) from puller.error.__cause__
        raise puller.error
    chunk_done()
    return puller.stats


def _from_urls(
    partial: PartialTransfer,
    options: PullOptions,
    cancel: threading.Event | None,
    chunk_done: Callable[[], None],
) -> EdgeAgentError | None:
    """Download what the release's URLs give; the problem if that fell short.

    The rest comes over MQTT, as for a release with no URL: a mirror that is down, slow
    or serving other bytes costs the fleet's broadcast, not the deploy. A disk that
    filled ends the pull (MQTT would fill it the same way).

    Raises:
        EdgeAgentError: command.cancelled; transfer.failed for a full disk.
    """
    fetch = UrlFetch(partial, timeout_s=options.url_timeout_s)
    if not fetch.wanted:
        return None
    fetch.start()
    try:
        flowed = _watch(fetch.done, partial, options, cancel, chunk_done, None)
    finally:
        fetch.stop()
    error = fetch.error
    if flowed and error is None:
        return None
    if error is not None and _out_of_space(error):
        raise error
    if error is None:
        error = EdgeAgentError(
            f"no byte of {partial.chunks.release.name} came from its URL for {options.stall_s:g} s",
            code="transfer.failed",
        )
    log_event(
        log,
        logging.WARNING,
        "url_fetch_failed",
        model=partial.chunks.release.name,
        code=error.code,
        problem=error.problem,
        missing=partial.count - partial.received,
    )
    return error


def _watch(
    done: threading.Event,
    partial: PartialTransfer,
    options: PullOptions,
    cancel: threading.Event | None,
    chunk_done: Callable[[], None],
    puller: Puller | None,
) -> bool:
    """Wait for `done`, reporting each chunk stored; False after `stall_s` with none.

    A puller whose broadcast flows is no stall, though none of its frames is new: a box
    that resumes joins a carousel that reaches the chunks it lacks only when it wraps, and
    that pass, paced to a fleet's slowest box, may outlast `stall_s`.

    Raises:
        EdgeAgentError: command.cancelled.
    """
    last_count, last_change = partial.received, time.monotonic()
    while not done.wait(0.1):
        if cancel is not None and cancel.is_set():
            raise EdgeAgentError("the pull was cancelled", code="command.cancelled")
        now = time.monotonic()
        if puller is not None:
            puller.tick(now)
        if partial.received != last_count:
            last_count, last_change = partial.received, now
            chunk_done()
            continue
        alive = max(last_change, puller.flowing_at if puller is not None else 0.0)
        if now - alive > options.stall_s:
            return False
    return True
