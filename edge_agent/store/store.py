"""The model store: verified releases on disk, one active version per name.

Layout below `Layout.store` (only this module knows it):

    blobs/<sha256>                      every file's bytes, once, read-only
    models/<name>/versions/<v>/         release.json + the release's files (hard links to blobs)
    models/<name>/state.json            {"current", "previous", "highest"}
    tmp/                                staging; emptied on the next update
    .lock                               one update at a time on this box
    .state.lock                         one state.json write at a time (`_state_writes`)

Why this shape:
- content-addressed blobs share bytes between versions and make `verify` a
  re-hash against the file's own name; the hard-linked version folder keeps the
  file names a model needs (an IR's .xml finds its .bin beside it);
- a version appears by one rename of a complete, fsynced folder, and
  `state.json` changes by one rename, so `current` and `previous` always move
  together and a crash leaves the old or the new model serving;
- `highest` is the rollback guard: a version at or below it is refused even
  after the operator removed it.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.manifest import Manifest
from edge_agent.config_files import drop_unknown_fields, first_error
from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import (
    fault,
    file_lock,
    fsync_dir,
    write_atomic,
)
from edge_agent.logs import log_event
from edge_agent.paths import Layout, is_safe_name
from edge_agent.store.install import publish, stage
from edge_agent.store.quota import check_quota, evict
from edge_agent.store.release import Release, SignedRelease, check_paths, parse_signed_release
from edge_agent.store.release import verify as verify_release
from edge_agent.store.verify import RELEASE_FILE, Problem, verify_version

log = logging.getLogger(__name__)

FAULT_STEPS = (
    "install.staged",
    "install.blobs",
    "install.linked",
    "install.after_rename",
    "install.state.tmp_written",
    "install.state.after_rename",
    "activate.verified",
    "activate.gated",
    "activate.tmp_written",
    "activate.after_rename",
)
"""Every point where a test may kill an update ($EDGE_AGENT_FAULT, see `fsio.fault`), in
the order an install then an activation passes them."""

Gate = Callable[[Path, Release], object]
"""The health gate: called with the model file and its release before the version
becomes current; raises EdgeAgentError (health.failed) to refuse it."""


class NameState(BaseModel):
    """Which versions of one name are active: the store's only mutable record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    current: int | None = Field(default=None, description="Version that serves.")
    previous: int | None = Field(default=None, description="Version `rollback` returns to.")
    highest: int = Field(default=0, description="Highest version ever installed (rollback guard).")


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """One installed version, for listings."""

    name: str
    version: int
    release: Release
    current: bool
    previous: bool

    @property
    def digest(self) -> str:
        return self.release.file(self.release.model).sha256


def _why(exc: ValueError | RecursionError) -> str:
    """What is wrong with a state file, in one line."""
    if isinstance(exc, ValidationError):
        where, message = first_error(exc)
        return f"{where}: {message}"
    return str(exc) or type(exc).__name__


class ModelStore:
    """Install, activate, roll back, remove and verify model versions under `layout.store`."""

    def __init__(
        self,
        layout: Layout,
        *,
        keep: int = 3,
        quota_bytes: int | None = None,
        lock_timeout_s: float = 900.0,
    ) -> None:
        """Args:
        keep: versions kept per name; older ones are evicted (never current or previous).
        quota_bytes: cap on the blobs' total size; None for no cap.
        lock_timeout_s: longest wait for another update on this box.
        """
        self.root = layout.store
        self.keep = keep
        self.quota_bytes = quota_bytes
        self.lock_timeout_s = lock_timeout_s
        self._newer_said: set[Path] = set()
        """state.json files whose dropped fields were logged (once each, not per read)."""

    # --- reading ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        folder = self.root / "models"
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if is_safe_name(p.name) and p.is_dir())

    def state(self, name: str) -> NameState:
        """Which versions of `name` serve.

        A field a newer edge-agent wrote is dropped (and said once): after a downgrade,
        a strict read made the name unusable, and every install and activation of any
        other name failed at its eviction, after it had taken effect. A file that does not
        read at all is set aside and rebuilt (`_mend_state`).

        Raises:
            EdgeAgentError: store.corrupt, when the file is not a state and cannot be set
                aside.
        """
        path = self._name_dir(name) / "state.json"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raw = None
        dropped: list[str] = []
        if raw is None:
            state = NameState()
        else:
            try:
                state, dropped = drop_unknown_fields(NameState.model_validate, json.loads(raw))
            except (ValueError, RecursionError) as exc:  # ValidationError is a ValueError
                state = self._mend_state(name, path, raw, _why(exc))
        if dropped and path not in self._newer_said:
            self._newer_said.add(path)
            log_event(
                log,
                logging.WARNING,
                "store_state_fields_dropped",
                model=name,
                fields=",".join(dropped),
                detail="written by a newer edge-agent; this one does not know them",
            )
        # A crash between a version's rename and the state update leaves `highest` behind.
        return state.model_copy(update={"highest": max([state.highest, *self.versions(name)])})

    def _mend_state(self, name: str, path: Path, seen: bytes, detail: str) -> NameState:
        """Set aside a `state.json` that does not read, as `state.json.damaged-<time>`, and
        write one rebuilt from what is installed.

        Left in place, one such file (a power cut on a card that lies about fsync) refused
        every command on its name, deploy, activate, rollback and remove, and every
        listing, and only a shell could mend it. What it said is lost but for `highest`,
        which the installed versions give again, so the rollback guard holds as far as the
        disk remembers. `current` and `previous` start empty: activating a version (the
        fleet's activate_model) makes the name serve again.

        Args:
            seen: the bytes that did not read; a file that differs now was written again
                meanwhile (an update, another mend) and is read instead.
        """
        rebuilt = NameState(highest=max(self.versions(name), default=0))
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        aside = path.with_name(f"state.json.damaged-{stamp}")
        try:
            # The re-check, the rename and the write in one hold of the state writes' lock:
            # a reader (no update lock) that checked, then renamed, set aside the state an
            # activation had written in between, and wrote its rebuilt one (no current
            # version) over it.
            with self._state_writes():
                try:
                    changed = path.read_bytes() != seen
                except FileNotFoundError:  # gone (a hand, a crash mid-mend): read as absent
                    changed = True
                if not changed:
                    path.rename(aside)
                    # Its folder's fsync keeps the rename.
                    self._write_state_locked(name, rebuilt, "mend")
        except OSError as exc:
            raise EdgeAgentError(
                f"{path} is corrupt ({detail}) and cannot be set aside: {exc.strerror or exc}",
                "make the store writable, or move the file away by hand; then activate a "
                "version of the model",
                code="store.corrupt",
            ) from None
        if changed:
            return self.state(name)  # with the lock let go: this may mend again
        log_event(
            log,
            logging.ERROR,
            "store_state_damaged",
            model=name,
            detail=detail,
            kept=str(aside),
            highest=rebuilt.highest,
            fix=f"activate a version of {name} (the activate_model command, or "
            f"`edge-agent models activate {name} VERSION`): until then it serves none",
        )
        return rebuilt

    def versions(self, name: str) -> list[int]:
        folder = self._name_dir(name) / "versions"
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())

    def release(self, name: str, version: int) -> SignedRelease:
        """The stored signed release of `name` v`version`.

        Raises:
            EdgeAgentError: store.not_found, store.corrupt.
        """
        path = self.version_dir(name, version) / RELEASE_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise EdgeAgentError(
                f"the store has no {name} v{version}",
                "see `edge-agent models list`",
                "store.not_found",
            ) from None
        try:
            return parse_signed_release(data, stored=True)
        except EdgeAgentError as exc:
            if exc.code == "release.unsupported":  # installed by a newer edge-agent: whole
                raise EdgeAgentError(f"{path}: {exc.problem}", exc.fix, exc.code) from None
            raise EdgeAgentError(f"{path}: {exc.problem}", code="store.corrupt") from None

    def installed(self, name: str, version: int) -> Release | None:
        """The release if that version is installed, else None (for idempotent deliveries)."""
        if not is_safe_name(name) or not (self.version_dir(name, version) / RELEASE_FILE).is_file():
            return None
        return self.release(name, version).release

    def _serving(self, name: str) -> tuple[int, Release] | None:
        """The current version of `name` and its release, or None when there is none."""
        if not is_safe_name(name):
            return None
        version = self.state(name).current
        if version is None:
            return None
        return version, self.release(name, version).release

    def current_manifest(self, name: str) -> Manifest | None:
        """The serving version's manifest, or None: a lookup that loads nothing, so its
        files are not hashed (`current` does that, for what is compiled)."""
        serving = self._serving(name)
        return None if serving is None else serving[1].manifest

    def current(self, name: str) -> ResolvedModel | None:
        """The serving version of `name` as the catalog wants it, or None if there is none.

        What this returns is compiled and run, so every file of the version is re-hashed
        against its signed release first: bytes that rotted or were altered since the
        activation's check must never load.

        Raises:
            EdgeAgentError: store.corrupt if a file differs from the release (or a stray
                file sits beside them); store.not_found if the version is gone.
        """
        serving = self._serving(name)
        if serving is None:
            return None
        version, release = serving
        # Hashed on every call, with no cache keyed by size, mtime or inode: rot on a
        # failing card, or a write that restores the mtime, changes bytes and none of
        # those, and a re-hash costs tens of ms on a pipeline start, never per frame.
        self._check_files(
            name,
            version,
            f"roll back to the previous version (`edge-agent models rollback {name}`, or "
            "the rollback_model command), or publish and deploy a higher version; "
            "`edge-agent models verify` lists every damaged file",
        )
        return ResolvedModel(release.manifest, self.version_dir(name, version) / release.model)

    def entries(self) -> list[StoredVersion]:
        """Every installed version of every name, with which is current and previous.

        Raises:
            EdgeAgentError: store.corrupt, for the first file that does not read.
        """
        found, damaged = self.readable_entries()
        if damaged:
            raise EdgeAgentError(
                str(damaged[0]), "run `edge-agent models verify`", code="store.corrupt"
            )
        return found

    def readable_entries(self) -> tuple[list[StoredVersion], list[Problem]]:
        """`entries`, less what does not read, and what that was.

        For the agent's state: one damaged file must not hide every other model, nor stop
        the birth message that says the box is online.
        """
        found: list[StoredVersion] = []
        damaged: list[Problem] = []
        try:
            names = self.names()
        except OSError as exc:
            return found, [Problem(str(self.root), f"cannot be read: {exc.strerror or exc}")]
        for name in names:
            try:
                state = self.state(name)
                versions = self.versions(name)
            except EdgeAgentError as exc:
                damaged.append(Problem(name, exc.problem))
                continue
            except OSError as exc:  # a failing card reads as EIO, a bad mode as EACCES
                damaged.append(Problem(name, f"cannot be read: {exc.strerror or exc}"))
                continue
            for version in versions:
                try:
                    release = self.release(name, version).release
                except EdgeAgentError as exc:
                    damaged.append(Problem(f"{name} v{version}", exc.problem))
                    continue
                except OSError as exc:
                    damaged.append(Problem(f"{name} v{version}", f"cannot be read: {exc}"))
                    continue
                found.append(
                    StoredVersion(
                        name=name,
                        version=version,
                        release=release,
                        current=state.current == version,
                        previous=state.previous == version,
                    )
                )
        return found, damaged

    def verify(self) -> list[Problem]:
        """Re-hash every stored byte; an empty list means all is well."""
        problems: list[Problem] = []
        for name in self.names():
            try:
                state = self.state(name)
            except EdgeAgentError as exc:
                # Named, and the versions still checked: `verify` is what the operator
                # runs to find out what is damaged, so it must not stop at the first.
                problems.append(Problem(name, exc.problem))
                state = NameState()
            versions = self.versions(name)
            for label, pointer in (("current", state.current), ("previous", state.previous)):
                if pointer is not None and pointer not in versions:
                    problems.append(Problem(f"{name}", f"{label} v{pointer} is not installed"))
            for version in versions:
                problems.extend(self._verify_version(name, version))
        return problems

    def version_dir(self, name: str, version: int) -> Path:
        return self._name_dir(name) / "versions" / str(version)

    # --- changing --------------------------------------------------------------------------
    def install(
        self,
        signed: SignedRelease,
        source: Path,
        *,
        trusted_keys: Sequence[Ed25519PublicKey] = (),
        now: datetime | None = None,
        link: bool = False,
    ) -> Release:
        """Verify a release and every byte of its files, then add it as a new version.

        Args:
            signed: the release; checked with `release.verify` against `trusted_keys`.
            source: folder holding the release's files at their relative paths.
            link: take the files by hard link instead of copying them (a finished
                transfer on the same file system; a copy across). `source` keeps its
                names, so an install that fails, or a power cut in it, leaves a transfer
                whole (they were renamed out, and a failure threw away every byte of a
                complete pull); its owner removes it after. The hash is taken of the
                bytes the store keeps, after the link.

        Returns:
            The installed release. Nothing becomes current: call `activate`.

        Raises:
            EdgeAgentError: release.*, store.path, transfer.digest, store.quota; nothing
                is left in the store.
        """
        with self._updating():
            return self._install(signed, source, trusted_keys, now, link)

    def _install(
        self,
        signed: SignedRelease,
        source: Path,
        trusted_keys: Sequence[Ed25519PublicKey],
        now: datetime | None,
        link: bool,
    ) -> Release:
        name = signed.release.name
        check_paths(signed.release)  # before `state(name)` touches a path built from it
        highest = self.state(name).highest
        release = verify_release(signed, trusted_keys, now or datetime.now(UTC), highest or None)
        check_quota(self, release)
        staging = self._staging(f"install-{name}-{release.version}")
        try:
            stage(release, source, staging, link)
            fault("install.staged")
            publish(signed, staging, self.root / "blobs", self._name_dir(name) / "versions")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            self._collect_blobs()
        self._write_state(name, self.state(name), "install.state")
        log_event(
            log,
            logging.INFO,
            "model_installed",
            model=name,
            version=release.version,
            digest=release.file(release.model).sha256,
        )
        evict(self, {(name, release.version)}, self._remove)
        return release

    def activate(self, name: str, version: int, gate: Gate | None = None) -> Release:
        """Make `name` v`version` current after re-verifying it and passing `gate`.

        The gate runs before the pointer moves, so a failing version never serves: the
        version that was current stays current.

        Raises:
            EdgeAgentError: store.not_found, store.corrupt, health.failed (from the gate).
        """
        with self._updating():
            return self._activate(name, version, gate)

    def deploy(
        self,
        signed: SignedRelease,
        source: Path,
        gate: Gate | None,
        *,
        trusted_keys: Sequence[Ed25519PublicKey] = (),
        now: datetime | None = None,
        link: bool = False,
    ) -> Release:
        """Install and activate under one lock; a version that fails activation (the gate,
        damaged bytes) is removed again, so a deployment is all or nothing.

        Raises:
            EdgeAgentError: as `install` and `activate`.
        """
        with self._updating():  # one lock for both: nothing slips in between
            release = self._install(signed, source, trusted_keys, now, link)
            try:
                return self._activate(release.name, release.version, gate)
            except EdgeAgentError:
                self._remove(release.name, release.version)
                raise

    def rollback(self, name: str) -> int:
        """Make the previous version current again (current becomes previous).

        No health gate: the previous version passed it when it was activated, and a
        rollback must work when everything else is failing.

        Returns:
            The version now current.

        Raises:
            EdgeAgentError: store.not_found if there is no previous version.
        """
        with self._updating():
            state = self.state(name)
            if state.previous is None or state.previous not in self.versions(name):
                raise EdgeAgentError(
                    f"{name} has no previous version to roll back to",
                    "activate a version by number with `models activate`",
                    "store.not_found",
                )
            self._check_files(
                name,
                state.previous,
                "activate an undamaged version by number with `models activate`, or publish "
                "and deploy a higher version; `edge-agent models verify` lists the damage",
            )
            self._write_state(
                name,
                state.model_copy(update={"current": state.previous, "previous": state.current}),
                "rollback",
            )
            log_event(
                log,
                logging.WARNING,
                "model_rolled_back",
                model=name,
                version=state.previous,
                from_version=state.current,
            )
            return state.previous

    def remove(self, name: str, version: int) -> None:
        """Delete an installed version that is neither current nor previous.

        Raises:
            EdgeAgentError: store.not_found; input.invalid for the current or the previous
                version.
        """
        with self._updating():
            # Its folder, not its release: one whose release.json no longer reads is what
            # an operator most needs to remove (it answered store.corrupt).
            if not is_safe_name(name) or not self.version_dir(name, version).is_dir():
                raise EdgeAgentError(
                    f"the store has no {name} v{version}",
                    "see `edge-agent models list`",
                    "store.not_found",
                )
            state = self.state(name)
            if state.current == version:
                raise EdgeAgentError(
                    f"{name} v{version} is current",
                    "activate or roll back to another version first",
                    "input.invalid",
                )
            if state.previous == version:
                # The previous version is what `rollback` returns to: removing it would leave
                # the serving model with nothing to fall back on (docs/PROTOCOL.md,
                # remove_model). Eviction spares it for the same reason.
                raise EdgeAgentError(
                    f"{name} v{version} is the previous version, kept for rollback",
                    f"activate another version first; v{version} then stops being previous "
                    "and can be removed",
                    "input.invalid",
                )
            self._remove(name, version)

    # --- internals -------------------------------------------------------------------------
    def _name_dir(self, name: str) -> Path:
        if not is_safe_name(name):
            raise EdgeAgentError(
                f"model name {name!r} is not a safe store name",
                "use letters, digits, '-', '_' and '.', no '..' and no '/'",
                "store.path",
            )
        return self.root / "models" / name

    @contextmanager
    def _updating(self) -> Iterator[None]:
        """Serialise updates on this box and sweep what a crashed update left."""
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.root / ".lock", self.lock_timeout_s):
            tmp = self.root / "tmp"
            if tmp.is_dir():
                for leftover in tmp.iterdir():
                    shutil.rmtree(leftover, ignore_errors=True)
            with self._state_writes():  # not a mend's temp file, about to be renamed
                for name in self.names():  # a state file's temp twin, if a crash beat its rename
                    for leftover in self._name_dir(name).glob(".state.json.tmp-*"):
                        leftover.unlink()
            self._collect_blobs()
            yield

    @contextmanager
    def _state_writes(self) -> Iterator[None]:
        """Hold the lock every write of a `state.json` is made under.

        Updates write states under the update lock, but `_mend_state` also writes from
        readers that do not hold it (listings, `current`). Taking the update lock there
        does not work: `state` is read both without it and under it (install, activate,
        rollback, remove, eviction), and an flock asked again on a second descriptor by
        the thread that holds it waits for itself until `lock_timeout_s`; a reader would
        also wait behind a whole install. This lock is held only around state writes,
        and nothing under it takes the update lock, so the two never wait on each other
        in a circle; it also keeps two writers in one process (one temp file name, by
        pid) apart.
        """
        with file_lock(self.root / ".state.lock", self.lock_timeout_s):
            yield

    def _staging(self, label: str) -> Path:
        path = self.root / "tmp" / f"{label}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def _activate(self, name: str, version: int, gate: Gate | None) -> Release:
        release = self.release(name, version).release
        self._check_files(
            name,
            version,
            "activate another version, or publish and deploy a higher one (this version "
            "cannot be installed again: the rollback guard refuses it); "
            "`edge-agent models verify` lists the damage",
        )
        fault("activate.verified")
        if gate is not None:
            gate(self.version_dir(name, version) / release.model, release)
        fault("activate.gated")
        state = self.state(name)
        if state.current != version:
            state = state.model_copy(update={"current": version, "previous": state.current})
        self._write_state(name, state, "activate")
        log_event(
            log,
            logging.INFO,
            "model_activated",
            model=name,
            version=version,
            digest=release.file(release.model).sha256,
        )
        evict(self, set(), self._remove)
        return release

    def _check_files(self, name: str, version: int, fix: str) -> None:
        """Raise store.corrupt unless every file of the version matches its release.

        `fix` is the caller's: what the operator can do differs between a version about to
        serve (activate, rollback) and the one serving now (`current`)."""
        problems = self._verify_version(name, version)
        if problems:
            raise EdgeAgentError(
                f"{name} v{version} is damaged: {problems[0]}", fix, "store.corrupt"
            )

    def _verify_version(self, name: str, version: int) -> list[Problem]:
        try:
            release = self.release(name, version).release
        except EdgeAgentError as exc:
            return [Problem(f"{name} v{version}", exc.problem)]
        return verify_version(f"{name} v{version}", self.version_dir(name, version), release)

    def _write_state(self, name: str, state: NameState, step: str) -> None:
        with self._state_writes():
            self._write_state_locked(name, state, step)

    def _write_state_locked(self, name: str, state: NameState, step: str) -> None:
        folder = self._name_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "state.json", state.model_dump_json().encode(), step)

    def _remove(self, name: str, version: int) -> None:
        state = self.state(name)
        if state.previous == version:
            self._write_state(name, state.model_copy(update={"previous": None}), "remove")
        folder = self.version_dir(name, version)
        # Rename out of sight first, so a crash mid-delete never leaves a half version.
        trash = self._staging(f"remove-{name}-{version}")
        folder.rename(trash / "version")
        fsync_dir(folder.parent)
        shutil.rmtree(trash, ignore_errors=True)
        self._collect_blobs()
        log_event(log, logging.INFO, "model_removed", model=name, version=version)

    def _collect_blobs(self) -> None:
        """Delete blobs no version links to (a link count of 1 is the blob alone). A transfer
        whose install failed may hold one more link: that blob goes once the transfer does
        (the next pull of its name, or its sweep), not before, so the transfer's bytes stay
        whole for a resume."""
        blobs = self.root / "blobs"
        if not blobs.is_dir():
            return
        for blob in blobs.iterdir():
            if blob.stat().st_nlink <= 1:
                blob.unlink()
