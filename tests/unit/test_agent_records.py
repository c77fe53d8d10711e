"""What the agent remembers across restarts: command answers, seq, pipelines."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_agent.agent.records import AgentRecords, CommandLog
from edge_agent.agent.roster import ended_how
from edge_agent.config_files import drop_unknown_fields
from edge_agent.pipelines.spec import PipelineSpec
from tests.disk_kit import files_capped_at


def test_a_command_id_runs_once_and_its_answer_is_kept(tmp_path: Path) -> None:
    log = CommandLog(tmp_path / "commands.sqlite")
    assert log.claim("c1") == (True, None)
    assert log.claim("c1") == (False, None)  # still running: no answer yet
    log.finish("c1", b'{"status":"ok"}')
    log.close()
    again = CommandLog(tmp_path / "commands.sqlite")
    assert again.claim("c1") == (False, b'{"status":"ok"}')
    assert again.claim("c2") == (True, None)
    again.close()


def test_an_answer_the_disk_refused_is_told_to_a_resend_and_written_later(tmp_path: Path) -> None:
    # The claim was written, the answer not (the disk filled meanwhile): the id stayed
    # open, every resend was told `accepted` for good, and the next start answered a
    # command that had finished ok with command.interrupted.
    log = CommandLog(tmp_path / "commands.sqlite")
    assert log.claim("d7") == (True, None)
    answer = b'{"status":"ok"}' + b" " * 300_000
    biggest = max(p.stat().st_size for p in tmp_path.iterdir())
    with files_capped_at(biggest + 4096):
        log.finish("d7", answer)
        assert log.claim("d7") == (False, answer)
    assert log.claim("d8") == (True, None)  # the disk takes writes again: both go down
    log.close()
    again = CommandLog(tmp_path / "commands.sqlite")
    assert again.unfinished() == ["d8"]
    assert again.claim("d7") == (False, answer)
    again.close()


def test_claims_and_answers_are_synced_before_the_broker_is_told(tmp_path: Path) -> None:
    # A claim the session acknowledged (PUBACK) must survive a power cut: NORMAL in WAL
    # mode left it in the page cache, and a cut lost the command the broker let go of.
    log = CommandLog(tmp_path / "commands.sqlite")
    assert log._db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    log.close()


def test_the_log_forgets_the_oldest_ids_beyond_its_bound(tmp_path: Path) -> None:
    log = CommandLog(tmp_path / "commands.sqlite", keep=10)
    for i in range(25):
        log.claim(f"c{i}")
        log.finish(f"c{i}", b"ok")  # answered: a claim still running is kept (test_dispatch)
    assert log.claim("c24")[0] is False
    assert log.claim("c0")[0] is True  # forgotten, so it would run again
    log.close()


def test_seq_goes_up_across_restarts_and_after_a_lost_record(tmp_path: Path) -> None:
    records = AgentRecords(tmp_path)
    first = records.next_seq()
    second = AgentRecords(tmp_path).next_seq()
    assert second > first >= int(time.time()) - 1
    (tmp_path / "agent.json").write_text("{not json")
    damaged = AgentRecords(tmp_path)
    assert damaged.record.pipelines == {}
    assert list(tmp_path.glob("agent.damaged-*")), "the damaged record is kept for the operator"
    assert damaged.next_seq() >= int(time.time())


def test_pipelines_survive_a_restart(tmp_path: Path) -> None:
    AgentRecords(tmp_path).update(pipelines={"cam1": {"id": "cam1"}}, telemetry_interval_s=5.0)
    back = AgentRecords(tmp_path).record
    assert back.pipelines == {"cam1": {"id": "cam1"}}
    assert back.telemetry_interval_s == 5.0
    assert not list(tmp_path.glob(".agent.json.*.tmp"))


def test_only_unknown_fields_are_dropped_from_a_record() -> None:
    spec = {
        "id": "gate",
        "model": {"name": "m", "later": 1},
        "source": {"type": "stream", "url": "rtsp://cam/1", "later": 2},
        "sinks": [{"type": "snapshot", "folder": "/tmp/s", "later": 3}],
        "later": 4,
    }
    parsed, dropped = drop_unknown_fields(PipelineSpec.model_validate, spec)
    assert sorted(dropped) == ["later", "model.later", "sinks.0.snapshot.later",
                               "source.stream.later"]  # fmt: skip
    assert parsed.source.url == "rtsp://cam/1"  # type: ignore[union-attr]
    assert spec["later"] == 4  # the caller's copy is left as it was
    with pytest.raises(ValidationError):  # a wrong value is still an error
        drop_unknown_fields(PipelineSpec.model_validate, {**spec, "id": "no spaces allowed"})


def test_a_record_nested_too_deep_to_parse_is_set_aside(tmp_path: Path) -> None:
    # json.loads raises RecursionError, not a ValueError: it left the agent's start.
    (tmp_path / "agent.json").write_text("[" * 200_000)
    records = AgentRecords(tmp_path)
    assert records.record.pipelines == {}
    assert list(tmp_path.glob("agent.damaged-*"))


def test_a_command_log_the_disk_refuses_is_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "commands.sqlite"
    CommandLog(path).close()  # a clean stop: the -wal and -shm files go
    # A full disk: the -shm cannot be made, and the agent used to exit at start.
    with files_capped_at(16 * 1024):
        log = CommandLog(path)
        assert log.claim("c1") == (True, None)
        log.finish("c1", b"ok")
        assert log.claim("c1") == (False, b"ok")  # still answered once, this run
    said = [r for r in caplog.records if getattr(r, "event", None) == "sqlite_in_memory"]
    assert len(said) == 1
    assert "may run twice" in said[0].fields["held"]  # type: ignore[attr-defined]
    log.close()


def test_a_record_the_disk_refuses_leaves_the_old_one_and_no_copy(tmp_path: Path) -> None:
    records = AgentRecords(tmp_path)
    records.update(seq=5)
    with files_capped_at(4096), pytest.raises(OSError, match="too large"):  # a full disk
        records.update(pipelines={"cam": {"pad": "x" * 8192}})
    assert [p.name for p in tmp_path.iterdir()] == ["agent.json"]
    assert AgentRecords(tmp_path).record.seq == 5


@pytest.mark.parametrize(
    ("source", "max_frames", "said"),
    [
        ({"type": "file"}, None, "played its source to the end"),
        ({"type": "folder"}, None, "played its source to the end"),
        ({"type": "stream"}, 5, "ran the max_frames (5) it was given"),
        ({"type": "camera"}, 9, "ran the max_frames (9) it was given"),
        # A file given max_frames may have ended first: the detail claims neither alone.
        ({"type": "file"}, 5, "played its source to the end or to its max_frames (5)"),
    ],
)
def test_a_finished_pipeline_is_said_to_have_ended_as_its_source_and_max_frames_allow(
    source: dict[str, str], max_frames: int | None, said: str
) -> None:
    assert ended_how({"source": source, "max_frames": max_frames}) == said
