"""The outbox keeps order, survives restarts and drops telemetry before answers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from edge_agent.errors import EdgeAgentError
from edge_agent.outbox import Outbox, Priority
from tests.disk_kit import files_capped_at

T = TypeVar("T")


def test_messages_come_back_in_order_and_ack_removes_them(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    for i in range(5):
        box.put(f"t/{i}", f"{i}".encode(), Priority.RESULT)
    queued = box.peek(10)
    assert [q.topic for q in queued] == [f"t/{i}" for i in range(5)]
    assert [q.payload for q in queued] == [b"0", b"1", b"2", b"3", b"4"]
    box.ack([queued[0].seq, queued[1].seq])
    assert [q.payload for q in box.peek(10)] == [b"2", b"3", b"4"]
    assert box.stats().depth == 3
    assert box.peek(10, after=queued[3].seq)[0].payload == b"4"


def test_survives_a_restart_with_bytes_and_drop_counts(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    box = Outbox(path, quota_bytes=100, clock=lambda: 1000.0)
    for _ in range(4):
        box.put("tele", b"x" * 40, Priority.TELEMETRY)
    before = box.stats()
    box.close()
    again = Outbox(path, quota_bytes=100, clock=lambda: 1010.0)
    after = again.stats()
    assert after.depth == before.depth == 2
    assert after.bytes == before.bytes
    assert after.dropped_telemetry == 2
    assert after.oldest_age_s == pytest.approx(10.0)
    assert [q.created_at for q in again.peek()] == [1000.0, 1000.0]


def test_telemetry_goes_first_then_results_never_answers(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", quota_bytes=300)
    box.put("resp", b"a" * 90, Priority.CRITICAL)
    box.put("tele", b"t" * 90, Priority.TELEMETRY)
    box.put("res", b"r" * 90, Priority.RESULT)
    # Room for one more answer: the telemetry goes, the result and the answer stay.
    box.put("resp", b"b" * 90, Priority.CRITICAL)
    assert [q.topic for q in box.peek()] == ["resp", "res", "resp"]
    # Another: the result goes.
    box.put("resp", b"c" * 90, Priority.CRITICAL)
    assert [q.topic for q in box.peek()] == ["resp", "resp", "resp"]
    # Telemetry into a box full of answers is itself the drop; nothing is evicted for it.
    assert box.put("tele", b"t" * 90, Priority.TELEMETRY) is None
    stats = box.stats()
    assert [q.payload[:1] for q in box.peek()] == [b"a", b"b", b"c"]
    assert (stats.dropped_telemetry, stats.dropped_result, stats.dropped_critical) == (2, 1, 0)
    # Only when nothing else is left does an old answer make room for a new one.
    box.put("resp", b"d" * 90, Priority.CRITICAL)
    assert [q.payload[:1] for q in box.peek()] == [b"b", b"c", b"d"]
    assert box.stats().dropped_critical == 1


def test_a_message_larger_than_the_quota_is_dropped_without_evicting(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", quota_bytes=100)
    box.put("tele", b"t" * 50, Priority.TELEMETRY)
    assert box.put("resp", b"x" * 500, Priority.CRITICAL) is None
    assert [q.topic for q in box.peek()] == ["tele"]
    assert box.stats().dropped_critical == 1


def test_concurrent_puts_keep_one_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")

    def writer(name: str) -> None:
        for i in range(200):
            box.put(name, str(i).encode(), Priority.RESULT)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queued = box.peek(1000)
    assert len(queued) == 600
    for name in ("a", "b", "c"):
        assert [int(q.payload) for q in queued if q.topic == name] == list(range(200))
    assert [q.seq for q in queued] == sorted(q.seq for q in queued)


def test_a_quota_that_is_not_positive_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError) as info:
        Outbox(tmp_path / "o.sqlite", quota_bytes=0)
    assert info.value.code == "config.invalid"


def test_a_file_where_its_folder_should_be_holds_the_outbox_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # It raised path.unwritable, and the agent exited at start. (Root ignores permission
    # bits; a file where a folder should be refuses everyone.)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    box = Outbox(blocker / "o.sqlite")
    assert not box.on_disk
    assert box.put("t/resp", b"a", Priority.CRITICAL) is not None
    assert [q.payload for q in box.peek()] == [b"a"]
    assert not box.move_to_disk()  # still refused, and said once only
    said = [r for r in caplog.records if getattr(r, "event", None) == "sqlite_in_memory"]
    assert len(said) == 1
    assert "lost if the agent stops" in said[0].fields["held"]  # type: ignore[attr-defined]


def test_an_outbox_held_in_memory_moves_to_its_file_when_the_disk_takes_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "o.sqlite"
    before = Outbox(path, quota_bytes=200, clock=lambda: 1.0)
    before.put("t/results/cam", b"old", Priority.RESULT)
    before.put("t/status", b"then", Priority.CRITICAL, retain=True)
    for _ in range(6):
        before.put("t/telemetry", b"x" * 40, Priority.TELEMETRY)  # two over the quota
    before.close()  # a clean stop: the -wal and -shm files go
    # A full disk: the -shm cannot be made (sqlite says `disk I/O error`).
    with files_capped_at(16 * 1024):
        box = Outbox(path, quota_bytes=200, clock=lambda: 2.0)
        assert not box.on_disk
        box.put("t/status", b"now", Priority.CRITICAL, retain=True)
        box.put("t/resp", b"answer", Priority.CRITICAL)
        for _ in range(4):
            box.put("t/telemetry", b"y" * 40, Priority.TELEMETRY)  # two more over the quota
        assert not box.move_to_disk()
        assert not box.on_disk
    assert box.move_to_disk()
    assert box.on_disk
    # The file's own messages first (made first), then what waited in memory; the newer
    # retained state replaced the one the file held; the drops of both are counted.
    waiting = [(q.topic, q.payload[:6]) for q in box.peek()]
    assert waiting[:2] == [("t/results/cam", b"old"), ("t/telemetry", b"x" * 6)]
    assert ("t/status", b"then") not in waiting
    assert waiting.index(("t/status", b"now")) < waiting.index(("t/resp", b"answer"))
    assert box.stats().dropped_telemetry == 4
    box.put("t/resp", b"after", Priority.CRITICAL)
    box.close()
    again = Outbox(path, quota_bytes=200)
    # Kept over a restart, and the quota still holds: telemetry made room for the answer.
    assert [q.payload for q in again.peek() if q.topic == "t/resp"] == [b"answer", b"after"]
    assert again.stats().bytes <= 200


def test_a_full_disk_drops_and_counts_instead_of_raising(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("resp", b"a" * 100, Priority.CRITICAL)
    # sqlite's own cap on the file's pages: the same SQLITE_FULL a full disk gives.
    (pages,) = box._db.execute("PRAGMA page_count").fetchone()
    box._db.execute(f"PRAGMA max_page_count = {pages}")
    assert box.put("res", b"r" * 200_000, Priority.RESULT) is None
    assert box.put("tele", b"t" * 200_000, Priority.TELEMETRY) is None
    assert box.refusing
    stats = box.stats()
    assert (stats.dropped_result, stats.dropped_telemetry, stats.dropped_critical) == (1, 1, 0)
    # Nothing half-written, and the byte count is still the file's.
    assert [q.topic for q in box.peek()] == ["resp"]
    assert stats.bytes == len("resp") + 100
    # Room again: puts work and the flag clears.
    box._db.execute("PRAGMA max_page_count = 1073741823")
    assert box.put("res", b"r" * 200_000, Priority.RESULT) is not None
    assert not box.refusing
    assert box.stats().bytes == len("resp") + 100 + len("res") + 200_000


def test_an_ack_the_disk_refuses_keeps_the_messages(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    seqs = [box.put("t", f"{i}".encode(), Priority.RESULT) for i in range(3)]
    box._db.execute("PRAGMA query_only = ON")  # writes fail: SQLITE_READONLY
    box.ack([s for s in seqs if s is not None])
    assert box.refusing
    assert box.stats().depth == 3  # sent again after a restart: at least once
    box._db.execute("PRAGMA query_only = OFF")
    box.ack([s for s in seqs if s is not None])
    assert box.stats().depth == 0
    assert box.stats().bytes == 0


def test_a_put_over_a_full_quota_reads_no_more_than_it_evicts(tmp_path: Path) -> None:
    # Making room once summed every evictable row on each put: 78 ms a put at the 64 MB
    # default, on the pipelines' threads, for as long as the broker was away. The bytes
    # waiting are counted as rows come and go, and eviction walks the (priority, seq) index.
    outbox = Outbox(tmp_path / "o.sqlite", quota_bytes=200 * 1000)
    payload = b"r" * 190
    for _ in range(2000):  # 200 bytes each with the topic: the quota twice over
        outbox.put("edge/r", payload, Priority.RESULT)
        outbox.put("edge/t", payload, Priority.TELEMETRY)
    statements: list[str] = []
    outbox._db.set_trace_callback(statements.append)
    assert outbox.put("edge/r", payload, Priority.RESULT) is not None
    outbox._db.set_trace_callback(None)
    assert not [s for s in statements if "SUM(" in s.upper() or "ORDER BY PRIORITY" in s.upper()]
    assert len(statements) <= 8, statements
    # The counts kept agree with the file, through evictions, acks and a reopen.
    outbox.ack([q.seq for q in outbox.peek(50)])
    stats = outbox.stats()
    (on_disk,) = outbox._db.execute("SELECT SUM(size) FROM messages").fetchone()
    assert stats.bytes == on_disk <= 200 * 1000
    assert stats.dropped_telemetry > 0
    outbox.close()
    reopened = Outbox(tmp_path / "o.sqlite", quota_bytes=200 * 1000)
    assert reopened.stats().bytes == on_disk
    reopened.close()


def test_a_retained_message_replaces_the_older_ones_on_its_topic(tmp_path: Path) -> None:
    # Home Assistant's occupancy through a day's outage: every change was sent after the
    # reconnect as if it happened then. Only what is so now is worth sending.
    outbox = Outbox(tmp_path / "o.sqlite")
    for i in range(50):
        outbox.put("ha/door/state", b"ON" if i % 2 == 0 else b"OFF", Priority.CRITICAL, retain=True)
        outbox.put("edge/r", f"result {i}".encode(), Priority.RESULT)
        outbox.put("ha/yard/state", b"ON", Priority.CRITICAL, retain=True)
    outbox.put("ha/door/state", b"not retained", Priority.CRITICAL)  # a plain one stays
    waiting = outbox.peek(1000)
    door = [(q.payload, q.retain) for q in waiting if q.topic == "ha/door/state"]
    assert door == [(b"OFF", True), (b"not retained", False)]
    assert [q.payload for q in waiting if q.topic == "ha/yard/state"] == [b"ON"]
    assert len([q for q in waiting if q.topic == "edge/r"]) == 50
    (on_disk,) = outbox._db.execute("SELECT SUM(size) FROM messages").fetchone()
    assert outbox.stats().bytes == on_disk
    assert outbox.stats().dropped_critical == 0  # replaced, not dropped
    outbox.close()


def test_the_newest_telemetry_is_one_step_away_however_long_the_backlog(tmp_path: Path) -> None:
    # The pump asks for it every batch on a slow link, to send it ahead of the results: a
    # scan of the rows behind it would cost more the longer the backlog grew.
    outbox = Outbox(tmp_path / "o.sqlite")
    outbox.put("edge/t", b"older", Priority.TELEMETRY)
    newest = outbox.put("edge/t", b"newest", Priority.TELEMETRY)
    assert newest is not None
    for i in range(20_000):
        outbox.put("edge/r", f"{i}".encode(), Priority.RESULT)
    found, steps = _vm_steps(outbox, lambda: outbox.newest(Priority.TELEMETRY))
    assert found is not None
    assert (found.seq, found.payload) == (newest, b"newest")
    assert steps < 5, f"{steps * 100} VM steps"
    assert outbox.newest(Priority.TELEMETRY, after=newest) is None
    assert outbox.newest(Priority.CRITICAL) is None
    outbox.close()


def test_stats_read_no_more_of_a_backlog_than_its_first_row(tmp_path: Path) -> None:
    # stats() counted every row, under the lock each put waits on, twice a telemetry
    # interval and on every state command: 32 ms at a full 64 MB quota, more from a cold
    # SD card, through the outage that filled it. The rows are counted as they come
    # and go, as the bytes are, and the oldest is the first.
    clock = iter(range(1_000_000, 2_000_000))
    outbox = Outbox(tmp_path / "o.sqlite", quota_bytes=400_000, clock=lambda: next(clock))
    for i in range(3000):
        outbox.put("edge/r", b"r" * 90, Priority.RESULT)
        outbox.put("edge/t", b"t" * 90, Priority.TELEMETRY)
        outbox.put("ha/door", b"ON" if i % 2 else b"OFF", Priority.CRITICAL, retain=True)
    outbox.ack([q.seq for q in outbox.peek(77)])

    def file_count() -> int:
        (rows,) = outbox._db.execute("SELECT COUNT(*) FROM messages").fetchone()
        return int(rows)

    stats, steps = _vm_steps(outbox, outbox.stats)
    assert steps < 5, f"{steps * 100} VM steps"
    # The count kept agrees with the file through evictions, replaced retained messages
    # and acks; the oldest is the first waiting.
    assert stats.dropped_telemetry > 0
    assert stats.depth == file_count() > 0
    (first,) = outbox._db.execute("SELECT MIN(created_at) FROM messages").fetchone()
    assert stats.oldest_age_s == pytest.approx(next(clock) - 1 - first)
    # ...through a write the disk refuses (rolled back, counted again)...
    outbox._db.execute("PRAGMA query_only = ON")
    assert outbox.put("edge/r", b"r", Priority.RESULT) is None
    outbox.ack([q.seq for q in outbox.peek(5)])
    outbox._db.execute("PRAGMA query_only = OFF")
    assert outbox.stats().depth == file_count()
    # ...and a reopen.
    depth = outbox.stats().depth
    outbox.close()
    reopened = Outbox(tmp_path / "o.sqlite", quota_bytes=400_000)
    assert reopened.stats().depth == depth
    reopened.ack([q.seq for q in reopened.peek(1000)])
    assert reopened.stats().depth == depth - 1000
    reopened.close()


def _vm_steps(outbox: Outbox, call: Callable[[], T]) -> tuple[T, int]:
    """What `call()` returns, and how many hundreds of sqlite VM steps it took."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    outbox._db.set_progress_handler(count, 100)  # called every 100 sqlite VM steps
    try:
        found = call()
    finally:
        outbox._db.set_progress_handler(None, 100)
    return found, steps


@pytest.mark.parametrize("payload_bytes", [300, 3000])
def test_the_quota_bounds_the_file_with_its_log(tmp_path: Path, payload_bytes: int) -> None:
    # The quota counted topic and payload bytes only: with sqlite's pages, indexes and its
    # write-ahead log the files ran to 2.2x a 4 MiB quota (2.4x with 3 KB results, one to a
    # page). An operator sizes the state disk by it.
    quota = 4 * 1024 * 1024
    outbox = Outbox(tmp_path / "o.sqlite", quota_bytes=quota)
    rng = np.random.default_rng(7)

    def on_disk() -> int:
        return sum(f.stat().st_size for f in tmp_path.iterdir())

    largest = 0
    for i in range(3 * quota // payload_bytes):
        size = int(rng.integers(payload_bytes // 2, payload_bytes * 3 // 2))
        priority = Priority.TELEMETRY if i % 5 == 0 else Priority.RESULT
        outbox.put("edge/box-0001/results/cam-lobby", bytes(size), priority)
        if i % 64 == 0:
            largest = max(largest, on_disk())
    largest = max(largest, on_disk())
    stats = outbox.stats()
    assert stats.dropped_telemetry + stats.dropped_result > 0  # the quota was reached
    assert largest <= quota, f"{largest / quota:.2f}x the quota"
    assert stats.bytes > quota * 0.6  # and the room is used, not given away
    outbox.close()


def test_what_is_on_its_way_is_not_dropped_for_room(tmp_path: Path) -> None:
    # A slow uplink at the quota: the pump sends the oldest rows, the very ones eviction
    # takes first. Evicted in flight, they reached the broker all the same and were
    # counted dropped; the rows dropped instead were never sent and never counted.
    outbox = Outbox(tmp_path / "o.sqlite", quota_bytes=1000)
    for i in range(10):  # 100 bytes each with the topic: the quota, full
        outbox.put("edge/t", f"{i:094d}".encode(), Priority.TELEMETRY)
    batch = outbox.peek(3)
    for queued in batch:
        outbox.going(queued)
    for i in range(4):  # room for four: the four oldest that are not on their way
        assert outbox.put("edge/r", f"{i:094d}".encode(), Priority.RESULT) is not None
    waiting = [q.seq for q in outbox.peek(100)]
    assert [q.seq for q in batch] == waiting[:3]
    assert [q.seq for q in batch][-1] + 5 == waiting[3]  # the next four went
    assert outbox.stats().dropped_telemetry == 4
    outbox.ack([q.seq for q in batch])  # acknowledged: gone, and never counted dropped
    assert outbox.stats().dropped_telemetry == 4
    assert outbox.stats().depth == 7
    # Nothing left to drop but what is on its way: the new message is the drop.
    for queued in outbox.peek(100):
        outbox.going(queued)
    assert outbox.put("edge/t", b"t" * 500, Priority.TELEMETRY) is None
    assert outbox.stats().depth == 7
    outbox.close()
