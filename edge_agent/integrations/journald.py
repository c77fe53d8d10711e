"""Log records to the systemd journal with structured fields, with no dependency.

journald's native protocol: one datagram per entry on
/run/systemd/journal/socket, each field `KEY=value\\n`, or, for a value holding
a newline, `KEY\\n` + its length as a 64-bit little-endian integer + the bytes
+ `\\n`. An entry too big for a datagram goes as a sealed memfd passed over
the socket, as sd_journal_send does. Fields: MESSAGE (the event line),
PRIORITY, SYSLOG_IDENTIFIER=edge-agent, EVENT, LOGGER, and PIPELINE, MODEL,
COMMAND_ID, DEVICE when the event has them, so `journalctl PIPELINE=dock`
finds one pipeline's lines.

Under systemd, stderr is already the journal (`$JOURNAL_STREAM`); once the
native handler is installed the stderr handler is taken off, or every line
would be there twice.
"""

from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import socket
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from edge_agent.logs import kv_line, record_fields

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "edge-agent"

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
_ID_FIELDS = {
    "pipeline": "PIPELINE",
    "model": "MODEL",
    "command_id": "COMMAND_ID",
    "device": "DEVICE",
}
_LINE_ONLY = ("time", "level", "logger")
"""The journal has its own timestamp, priority and identity: MESSAGE leaves them out."""
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
_STDERR_HANDLER = "edge-agent"
"""The name `logs.setup_logging` gives its handler."""


def priority(level: int) -> int:
    """The syslog priority of a logging level."""
    for threshold in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if level >= threshold:
            return _PRIORITY[threshold]
    return _PRIORITY[logging.DEBUG]


def encode_field(key: str, value: str) -> bytes:
    """One field in the native protocol."""
    data = value.encode("utf-8", "replace")
    if b"\n" in data:
        return key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return key.encode() + b"=" + data + b"\n"


def encode_entry(fields: Mapping[str, str]) -> bytes:
    """One journal entry."""
    return b"".join(encode_field(key, value) for key, value in fields.items())


def journal_fields(record: logging.LogRecord, trace: str | None = None) -> dict[str, str]:
    """The journal fields of one log record."""
    fields = record_fields(record)
    line = {k: v for k, v in fields.items() if k not in _LINE_ONLY}
    message = kv_line(line)
    if trace:
        message += "\n" + trace
    out = {
        "MESSAGE": message,
        "PRIORITY": str(priority(record.levelno)),
        "SYSLOG_IDENTIFIER": IDENTIFIER,
        "EVENT": str(fields["event"]),
        "LOGGER": record.name,
    }
    for key, name in _ID_FIELDS.items():
        if key in fields and fields[key] is not None:
            out[name] = str(fields[key])
    out["CODE_FILE"] = record.pathname
    out["CODE_LINE"] = str(record.lineno)
    out["CODE_FUNC"] = record.funcName
    return out


class JournalHandler(logging.Handler):
    """Sends each record to journald; a record that cannot be sent is counted, never raised.

    Args:
        address: The journal's socket (a test points it at its own).
    """

    def __init__(self, address: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self.address = address
        self.dropped = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.set_name("edge-agent-journal")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            trace = None
            if record.exc_info and record.exc_info[1] is not None:
                trace = logging.Formatter().formatException(record.exc_info)
            self.send(encode_entry(journal_fields(record, trace)))
        except Exception:  # a log line must never take down its caller
            self.dropped += 1

    def send(self, entry: bytes) -> bool:
        """Send one encoded entry; True when the journal took it."""
        try:
            self._sock.sendto(entry, self.address)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                self.dropped += 1
                return False
        return self._send_memfd(entry)

    def _send_memfd(self, entry: bytes) -> bool:
        # Too big for one datagram: journald reads it from a sealed memfd instead.
        fd = os.memfd_create("journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, entry)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            # sendmsg, not socket.send_fds: before 3.12 that one ignores its address.
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            self._sock.sendmsg([b""], rights, 0, self.address)
            return True
        except OSError:
            self.dropped += 1
            return False
        finally:
            os.close(fd)

    def close(self) -> None:
        self._sock.close()
        super().close()


def stderr_is_journal(env: Mapping[str, str]) -> bool:
    """True when systemd connected our stderr to the journal ($JOURNAL_STREAM = dev:inode)."""
    stream = env.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        stat = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return (stat.st_dev, stat.st_ino) == (int(device), int(inode))


def wanted(mode: bool | Literal["auto"], env: Mapping[str, str], address: str) -> bool:
    """Whether to log to the journal: asked for, or `auto` and run by systemd."""
    if mode == "auto":
        return bool(env.get("JOURNAL_STREAM")) and Path(address).exists()
    return bool(mode)


class JournalLogging:
    """Installs a `JournalHandler` on the root logger, and takes it off again.

    Args:
        env: The environment ($JOURNAL_STREAM).
        address: The journal's socket.
    """

    def __init__(self, env: Mapping[str, str], address: str = JOURNAL_SOCKET) -> None:
        self.handler = JournalHandler(address)
        root = logging.getLogger()
        self._removed: list[logging.Handler] = []
        if stderr_is_journal(env):
            self._removed = [h for h in root.handlers if h.get_name() == _STDERR_HANDLER]
            for handler in self._removed:
                root.removeHandler(handler)
        root.addHandler(self.handler)

    def close(self) -> None:
        """Take the handler off and give stderr its handler back."""
        root = logging.getLogger()
        root.removeHandler(self.handler)
        for handler in self._removed:
            root.addHandler(handler)
        self.handler.close()
