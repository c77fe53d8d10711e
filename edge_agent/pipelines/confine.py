"""Paths a pipeline may not name: where edge-agent keeps its own data.

A spec names files it writes (jsonl, snapshot and capture sinks) and reads (file,
folder and WAV sources), and over MQTT whoever may command the box writes the spec. A
jsonl sink in a store version folder made the store take that version for corrupt, for
every pipeline on it and across restarts; a snapshot sink deletes the oldest JPEGs of
the folder it is given. `refuse_protected` is asked before anything is opened, with
every path resolved as the kernel will open it (symlinks, '..'), so no spelling of a
protected path gets past it.

A pipeline started by command writes, besides, only inside the agent's state folder
(`confine_writes`): outside systemd's sandbox a jsonl sink's cap renamed a user's .bashrc
over .bashrc.1 and wrote JSON lines in its place. The local CLI writes where its user says.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.audio_sources import WavSourceSpec
from edge_agent.pipelines.capture import CaptureSinkSpec
from edge_agent.pipelines.sinks import JsonLinesSinkSpec, SnapshotSinkSpec
from edge_agent.pipelines.sources import FileSourceSpec, FolderSourceSpec
from edge_agent.pipelines.spec import PipelineSpec

_FIX = (
    "name a path outside it: beside it in the state folder, or elsewhere (a capture sink "
    "without a folder keeps its frames in the pipeline's own captures folder)"
)


def spec_paths(spec: PipelineSpec) -> list[tuple[str, Path, bool]]:
    """Every path the spec names, as (its field, the path, whether it is written)."""
    found: list[tuple[str, Path, bool]] = []
    for i, sink in enumerate(spec.sinks):
        if isinstance(sink, JsonLinesSinkSpec):
            if sink.path is not None:
                found.append((f"sinks.{i}.path", sink.path, True))
        elif isinstance(sink, CaptureSinkSpec):
            if sink.folder is not None:
                found.append((f"sinks.{i}.folder", sink.folder, True))
        else:
            found.append((f"sinks.{i}.folder", sink.folder, True))
    if isinstance(spec.source, FileSourceSpec | FolderSourceSpec | WavSourceSpec):
        found.append(("source.path", spec.source.path, False))
    return found


def confine_writes(
    spec: PipelineSpec, folder: Path, *, code: str, field_prefix: str = ""
) -> PipelineSpec:
    """The spec with every file and folder its sinks write inside `folder`.

    A relative path is taken inside `folder` (and so recorded); a path that is not inside
    it once symlinks and '..' are resolved is refused. A jsonl sink on stdout, and a
    capture sink on the pipeline's own captures folder, name no path.

    Args:
        spec: The pipeline.
        folder: Where its sinks may write (the agent's state folder).
        code: The error's code (`command.invalid`).
        field_prefix: Where the spec sits in what was given (`args.spec.`).

    Raises:
        EdgeAgentError: `code`, naming the field, the path and `folder`.
    """
    _refuse_nul(spec, code, field_prefix)
    root = _real(folder)
    sinks: list[JsonLinesSinkSpec | SnapshotSinkSpec | CaptureSinkSpec] = []
    for i, sink in enumerate(spec.sinks):
        key = "path" if isinstance(sink, JsonLinesSinkSpec) else "folder"
        given = sink.path if isinstance(sink, JsonLinesSinkSpec) else sink.folder
        if given is None:
            sinks.append(sink)
            continue
        path = folder / given  # an absolute `given` stays as it is
        if not _real(path).is_relative_to(root):
            field = f"{field_prefix}sinks.{i}.{key}"
            raise EdgeAgentError(
                f"{field} {given} is outside {folder}, the agent's state folder: a pipeline "
                "started by command writes only there",
                f"give a path inside {folder}, or a relative one (taken inside it), e.g. "
                f"{spec.id}.jsonl",
                code=code,
                field=field,
            )
        sinks.append(sink.model_copy(update={key: path}))
    return spec.model_copy(update={"sinks": sinks})


def refuse_protected_path(
    given: Path, protected: Iterable[Path], *, code: str, field: str, fix: str
) -> None:
    """Refuse a path inside a protected file or folder, as `refuse_protected` does a spec's
    (a command's data folder: `calibrate`'s).

    Args:
        given: The path, as given.
        protected: What no command may name.
        code: The error's code (`command.invalid`).
        field: Where the path is in what was given (`args.data`).
        fix: What to give instead.

    Raises:
        EdgeAgentError: `code`, naming the field, the path and what it is inside.
    """
    if "\x00" in str(given):
        raise _nul(field, code)
    _refuse_inside(given, [_real(p) for p in protected], code, field, fix)


def _refuse_nul(spec: PipelineSpec, code: str, field_prefix: str) -> None:
    # No file has one: the OS refuses it, and realpath's ValueError reached the command's
    # answer as an `internal` crash that named no field.
    for field, given, _ in spec_paths(spec):
        if "\x00" in str(given):
            raise _nul(f"{field_prefix}{field}", code)


def _nul(field: str, code: str) -> EdgeAgentError:
    return EdgeAgentError(
        f"{field} has a NUL character in it", "give the path without it", code=code, field=field
    )


def _refuse_inside(given: Path, roots: list[Path], code: str, field: str, fix: str) -> None:
    path = _real(given)
    inside = next((root for root in roots if path.is_relative_to(root)), None)
    if inside is not None:
        raise EdgeAgentError(
            f"{field} {given} is inside {inside}, which edge-agent keeps its own data in",
            fix,
            code=code,
            field=field,
        )


def _real(path: Path) -> Path:
    # realpath, not Path.resolve: a symlink loop is left as it is (nothing can open it)
    # rather than raised as a RuntimeError.
    return Path(os.path.realpath(path))


def refuse_protected(
    spec: PipelineSpec,
    protected: Iterable[Path],
    *,
    code: str,
    field_prefix: str = "",
    writes_only: bool = False,
) -> None:
    """Refuse a spec that names a path inside a protected file or folder.

    Args:
        spec: The pipeline.
        protected: What no pipeline may name (`Layout.owned`, files the config names).
        code: The error's code, as the caller reports a bad spec (`command.invalid`).
        field_prefix: Where the spec sits in what was given (`args.spec.`), for the
            error's field.
        writes_only: Check the sinks only (the local CLI: reading is the user's own
            business there).

    Raises:
        EdgeAgentError: `code`, naming the field, the path and what it is inside.
    """
    _refuse_nul(spec, code, field_prefix)
    roots = [_real(p) for p in protected]
    for field, given, writes in spec_paths(spec):
        if not writes_only or writes:
            _refuse_inside(given, roots, code, f"{field_prefix}{field}", _FIX)
    source = spec.source
    if writes_only or not isinstance(source, FolderSourceSpec):
        return
    # A folder source reads what its pattern matches, which may lie below the folder or
    # (with '..') beside it.
    field = f"{field_prefix}source.pattern"
    if ".." in PurePosixPath(source.pattern).parts:
        raise EdgeAgentError(
            f"{field} {source.pattern!r} climbs out of the folder with '..'",
            "name the folder the images are in, and a pattern within it",
            code=code,
            field=field,
        )
    folder = _real(source.path)
    # A pattern without '/' still matches the files beside a protected one in this folder
    # (`outbox.sqlite*` in the state folder).
    named = next(
        (
            root
            for root in roots
            if root.parent == folder and fnmatch.fnmatchcase(root.name, source.pattern)
        ),
        None,
    )
    if named is not None:
        raise EdgeAgentError(
            f"{field} {source.pattern!r} in {source.path} matches {named.name}, which "
            "edge-agent keeps its own data in",
            "name a folder that holds only images, or a pattern that matches only them",
            code=code,
            field=field,
        )
    if "/" in source.pattern or "**" in source.pattern:
        below = next((root for root in roots if root.is_relative_to(folder)), None)
        if below is not None:
            raise EdgeAgentError(
                f"{field} {source.pattern!r} reaches below {source.path}, into {below}, "
                "which edge-agent keeps its own data in",
                "name a folder that holds only images, or a pattern without '/' and '**'",
                code=code,
                field=field,
            )
