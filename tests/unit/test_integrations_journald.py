"""journald's native protocol: we play journald's side of the socket."""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.integrations import journald
from edge_agent.logs import log_context, log_event, setup_logging


def decode(entry: bytes) -> dict[str, str]:
    """journald's parser: KEY=value lines, or KEY\\n + 64-bit LE length + data + \\n."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(entry):
        end = entry.index(b"\n", pos)
        line = entry[pos:end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            pos = end + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", entry[end + 1 : end + 9])
            value = entry[end + 9 : end + 9 + size]
            assert entry[end + 9 + size : end + 10 + size] == b"\n"
            pos = end + 10 + size
        assert key.isupper() or b"_" in key, key
        fields[key.decode()] = value.decode()
    return fields


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "journal.socket"))
    sock.settimeout(2.0)
    yield sock
    sock.close()


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("edge_agent.test_journald")
    old = log.level
    log.setLevel(logging.DEBUG)
    yield log
    log.setLevel(old)


def test_fields_are_encoded_plain_or_with_a_length() -> None:
    assert journald.encode_field("PIPELINE", "dock") == b"PIPELINE=dock\n"
    binary = journald.encode_field("MESSAGE", "a\nb")
    assert binary == b"MESSAGE\n" + struct.pack("<Q", 3) + b"a\nb\n"
    entry = journald.encode_entry({"MESSAGE": "two\nlines", "PRIORITY": "6"})
    assert decode(entry) == {"MESSAGE": "two\nlines", "PRIORITY": "6"}


@pytest.mark.parametrize(
    ("level", "expected"),
    [(logging.DEBUG, 7), (logging.INFO, 6), (logging.WARNING, 4), (logging.ERROR, 3), (50, 2)],
)
def test_priorities_are_syslogs(level: int, expected: int) -> None:
    assert journald.priority(level) == expected


def test_a_log_event_reaches_the_journal_with_structured_fields(
    journal: socket.socket, logger: logging.Logger
) -> None:
    handler = journald.JournalHandler(journal.getsockname())
    logger.addHandler(handler)
    try:
        with log_context(command_id="c-42"):
            log_event(
                logger, logging.WARNING, "model_swapped", pipeline="dock", model="ssd", old="a b"
            )
    finally:
        logger.removeHandler(handler)
        handler.close()
    fields = decode(journal.recv(65536))
    assert (
        fields["MESSAGE"] == 'event=model_swapped pipeline=dock model=ssd command_id=c-42 old="a b"'
    )
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "edge-agent"
    assert fields["PIPELINE"] == "dock"
    assert fields["MODEL"] == "ssd"
    assert fields["COMMAND_ID"] == "c-42"
    assert fields["EVENT"] == "model_swapped"
    assert fields["CODE_FILE"].endswith("test_integrations_journald.py")


def test_a_crash_carries_its_traceback_in_the_message(
    journal: socket.socket, logger: logging.Logger
) -> None:
    handler = journald.JournalHandler(journal.getsockname())
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("event=pipeline_crashed")
    finally:
        logger.removeHandler(handler)
        handler.close()
    fields = decode(journal.recv(65536))
    assert fields["PRIORITY"] == "3"
    assert "RuntimeError: boom" in fields["MESSAGE"]
    assert "Traceback" in fields["MESSAGE"]


def test_an_entry_too_big_for_a_datagram_goes_as_a_sealed_memfd(journal: socket.socket) -> None:
    journal.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    handler = journald.JournalHandler(journal.getsockname())
    big = journald.encode_entry({"MESSAGE": "x" * (4 << 20)})
    try:
        assert handler.send(big)
    finally:
        handler.close()
    data, fds, _, _ = socket.recv_fds(journal, 1024, 1)
    assert data == b""
    [fd] = fds
    try:
        assert os.pread(fd, len(big) + 1, 0) == big
        with pytest.raises(PermissionError):  # sealed: journald can trust it will not change
            os.pwrite(fd, b"y", 0)
    finally:
        os.close(fd)


def test_a_journal_that_is_not_there_drops_and_counts(tmp_path: Path) -> None:
    handler = journald.JournalHandler(str(tmp_path / "nobody"))
    assert not handler.send(b"MESSAGE=x\n")
    assert handler.dropped == 1
    handler.close()


def test_auto_means_run_by_systemd(journal: socket.socket) -> None:
    address = journal.getsockname()
    assert not journald.wanted("auto", {}, address)
    assert journald.wanted("auto", {"JOURNAL_STREAM": "8:1234"}, address)
    assert not journald.wanted("auto", {"JOURNAL_STREAM": "8:1234"}, "/nonexistent/socket")
    assert journald.wanted(True, {}, address)
    assert not journald.wanted(False, {"JOURNAL_STREAM": "8:1234"}, address)


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), logging.getLogger("edge_agent").level
    yield root
    root.handlers[:] = handlers
    logging.getLogger("edge_agent").setLevel(level)


def test_when_stderr_is_the_journal_lines_are_not_written_twice(
    journal: socket.socket, root_logging: logging.Logger
) -> None:
    setup_logging(1)
    root = root_logging
    stat = os.fstat(2)
    env = {"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}
    installed = journald.JournalLogging(env, journal.getsockname())
    try:
        names = [h.get_name() for h in root.handlers]
        assert "edge-agent-journal" in names
        assert "edge-agent" not in names
    finally:
        installed.close()
    names = [h.get_name() for h in root.handlers]
    assert "edge-agent" in names
    assert "edge-agent-journal" not in names
    # Asked for outside systemd (a terminal): stderr keeps its lines too.
    installed = journald.JournalLogging({}, journal.getsockname())
    try:
        assert {"edge-agent", "edge-agent-journal"} <= {h.get_name() for h in root.handlers}
    finally:
        installed.close()
