"""The one error type that reaches an operator.

Everything a user can get wrong (a path, a model name, a device, a corrupt
file) is raised as `EdgeAgentError` at the boundary where it is detected, with
a `fix` that says what to do and a stable `code` for machines. The CLI prints
it as one line and exits non-zero; the agent answers a command with its code
and message. Anything else is a bug and keeps its traceback.

Codes are dotted, `area.what`, and never change meaning once published: the
fleet console and scripts match on them. `CODES` lists every one in use, so
docs/PROTOCOL.md can be generated from it and a typo fails a test.
"""

from __future__ import annotations

import errno

CODES: dict[str, str] = {
    "error": "An operator-fixable problem with no more specific code.",
    "input.invalid": "An argument, file or message field is malformed or out of range.",
    "input.not_found": "A named input file or folder does not exist.",
    "input.unreadable": "An input exists but cannot be decoded (image, WAV, video).",
    "model.not_found": "No model by that name or path.",
    "model.corrupt": "A model file cannot be read or does not match its digest.",
    "model.shape": "The model cannot take the requested input shape or batch.",
    "model.incompatible": "The model does not fit this use (engine, task, outputs).",
    "model.fetch_failed": "A reference model could not be downloaded or verified.",
    "device.unavailable": "No requested device could compile the model.",
    "device.invalid": "A device request names a device that does not exist.",
    "inference.failed": "The engine raised while running the model.",
    "source.unreachable": "A camera, stream or file source cannot be opened.",
    "source.failed": "A source failed for good mid-stream (truncated, gone, stalled).",
    "sink.failed": "A sink cannot write where it was told to.",
    "path.unwritable": "An output, cache or state folder cannot be written.",
    "path.denied": "This user may not read or write a path it needs (permissions).",
    "config.invalid": "A config, spec, manifest or recipe file is invalid.",
    "calibration.failed": "Calibration could not produce or judge a model.",
    "release.invalid": "A model release is malformed.",
    "release.unsupported": "A release uses fields or a format a newer edge-fleet wrote.",
    "release.signature": "A release is unsigned, wrongly signed or signed by an untrusted key.",
    "release.expired": "A release is past its expires-at.",
    "release.rollback": (
        "A release is not newer than the installed version of that model; or, deployed as "
        "the newest, it is older than the version serving."
    ),
    "release.conflict": "The box holds other bytes under a release's name and version.",
    "store.path": "A name or path would escape the model store.",
    "store.not_found": "The store has no such model or version.",
    "store.quota": "The store is over its disk quota and nothing can be evicted.",
    "store.corrupt": "Bytes in the store no longer match their digest.",
    "transfer.failed": "A model transfer did not complete.",
    "transfer.digest": "Transferred bytes do not match the release.",
    "health.failed": "A model version failed the health gate and was not activated; the "
    "version active before it stays active.",
    "command.invalid": "A command envelope or its arguments are malformed.",
    "command.unknown": "The command type is not known to this agent.",
    "command.expired": "The command arrived after its expires_at.",
    "command.too_large": "The command payload is over the size limit.",
    "command.cancelled": "The command was cancelled before it finished.",
    "command.busy": "A conflicting job is already running, or the agent runs all it may.",
    "command.interrupted": (
        "The agent stopped (a restart, a crash, a power cut) before the command ended."
    ),
    "command.timeout": "The console got no final answer in time; the command expires then.",
    "pipeline.not_found": "No running pipeline has that id.",
    "pipeline.exists": "A pipeline with that id is already running.",
    "broker.unreachable": "The MQTT broker cannot be reached.",
    "broker.refused": "The broker took a message and refused it (MQTT 5: an ACL, a quota).",
    "agent.running": "Another agent runs on the same state folder.",
    "install.incomplete": "edge-agent's install lacks a file or an optional package it needs.",
    "internal": "A bug: the agent kept serving; the log has the traceback.",
}


class EdgeAgentError(Exception):
    """A problem the operator can fix, with the fix and a stable machine-readable code."""

    def __init__(
        self, problem: str, fix: str = "", code: str = "error", field: str | None = None
    ) -> None:
        super().__init__(problem)
        if code not in CODES:
            # A typo in a code is a bug in edge-agent, caught by the first test that raises it.
            raise ValueError(f"unknown error code {code!r}")
        self.problem = problem
        self.fix = fix
        self.code = code
        self.field = field
        """The dotted place of the wrong value in what was given (`args.spec.sinks.0.path`),
        when one is: a command's error answer names it."""

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


def from_os_error(exc: OSError) -> EdgeAgentError:
    """An OSError no command caught itself (a path that cannot be made, read or written), as
    the one line an operator sees: the last net under the promise of no traceback.

    An OSError does not say whether it came from a read or a write, so the code and fix
    follow what the errno does say: a missing path, a permission, a full or read-only disk,
    a file where a folder should be (nearly always an output made under a file). A read
    refused for permission is path.denied, and is not told to look for disk space."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    problem = f"{exc.strerror or exc}" + (f": {where}" if where else "")
    if isinstance(exc, FileNotFoundError):
        return EdgeAgentError(
            problem, "check the path; a folder it names must exist", code="input.not_found"
        )
    # A full or read-only disk before the path check: a write or an fsync that fails so
    # carries no file name, and was told to "see the log above" with nothing logged.
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return EdgeAgentError(
            problem,
            "free space on that disk (or raise the quota), then run again",
            code="path.unwritable",
        )
    if exc.errno == errno.EROFS:
        return EdgeAgentError(
            problem,
            "its filesystem is mounted read-only: pick a writable folder",
            code="path.unwritable",
        )
    if exc.filename is None:  # not about a path at all (a socket, say)
        return EdgeAgentError(problem, "see the log above, and run again", code="error")
    if isinstance(exc, PermissionError):
        return EdgeAgentError(
            problem,
            "check with `ls -ld` that this user may read it (and write it, for an output "
            "or state folder); run as the service's user or fix the owner",
            code="path.denied",
        )
    if isinstance(exc, IsADirectoryError | NotADirectoryError | FileExistsError):
        # Nearly always an output being made under a file, or over a folder.
        return EdgeAgentError(
            problem,
            "a file stands where a folder is needed, or a folder where a file is: "
            "check the path, or pick another",
            code="path.unwritable",
        )
    return EdgeAgentError(
        problem,
        "check the path: that it exists, that this user may read and write it, and that "
        "its disk is healthy and has room",
        code="error",
    )
