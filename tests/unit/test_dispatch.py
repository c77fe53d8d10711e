"""Every command payload gets an answer, and none can stop the dispatcher."""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from edge_agent import __version__
from edge_agent.agent.dispatch import MAX_WAITING_COMMANDS, Dispatcher
from edge_agent.agent.jobs import JobContext, Jobs
from edge_agent.agent.records import CommandLog
from edge_agent.errors import EdgeAgentError
from edge_agent.protocol.agent import MAX_QUEUED_JOBS, Response


class _Supervisor:
    """Counts runs; deploy_model steps through progress and honours cancel; activate_model
    commits (its point of no return), then waits for `finish_commit`; calibrate takes
    `calibrate_s` and never looks at the flag."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.release = threading.Event()
        self.hold = threading.Event()
        self.hold.set()
        self.steps, self.step_s = 4, 0.05
        self.committed = threading.Event()
        self.finish_commit = threading.Event()
        self.calibrate_s = 0.0
        self.store_lock = threading.Event()  # rollback_model waits on it, as on a deploy's
        self.store_lock.set()

    def run_command(self, kind: str, args: BaseModel, job: JobContext) -> dict[str, Any]:
        self.runs.append(kind)
        if kind == "ping":
            return {"pong": True}
        if kind == "get_status":
            raise RuntimeError("a bug")
        if kind == "list_models":
            raise EdgeAgentError("store is gone", "reinstall", code="store.not_found")
        if kind == "deploy_model":
            self.hold.wait(10)
            for step in range(self.steps):
                job.progress("pull", step / self.steps)
                if self.release.wait(self.step_s) or job.cancelled:
                    break
            for step in range(self.steps):
                job.progress("install", step / self.steps)
            job.check()
            return {"installed": getattr(args, "name", "")}
        if kind == "activate_model":
            job.commit()
            self.committed.set()
            self.finish_commit.wait(5)
            return {"activated": True}
        if kind == "remove_model":
            raise OSError(errno.ENOSPC, "No space left on device", "/state/store/m/3")
        if kind == "rollback_model":
            self.store_lock.wait(10)
            return {"rolled_back": True}
        if kind == "calibrate":
            time.sleep(self.calibrate_s)
            return {"calibrated": True}
        return {}


class _Harness:
    def __init__(self, tmp_path: Path, now: float = 1000.0) -> None:
        self.answers: list[Response] = []
        self.lock = threading.Lock()
        self.supervisor = _Supervisor()
        self.log = CommandLog(tmp_path / "c.sqlite")
        self.dispatcher = Dispatcher(
            "dock-7",
            self.supervisor,
            self._answer,
            self.log,
            max_bytes=64 * 1024,
            clock=lambda: now,
        )

    def _answer(self, response: Response) -> None:
        with self.lock:
            self.answers.append(response)

    def send(self, payload: bytes | dict[str, Any], broker_expiry_s: int | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.dispatcher.handle(data, broker_expiry_s)

    def final(self, command_id: str, timeout: float = 5.0) -> Response:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                done = [
                    a for a in self.answers if a.id == command_id and a.status in ("ok", "error")
                ]
            if done:
                return done[-1]
            time.sleep(0.01)
        raise AssertionError(f"no final answer for {command_id}: {self.answers}")

    def close(self) -> None:
        self.dispatcher.close(1.0)
        self.log.close()


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a state the test can see, never for a time that a loaded runner may miss."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the state never came"
        time.sleep(0.005)


def _cmd(cid: str, kind: str, args: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": cid, "type": kind, "args": args or {}, "sent_at": 999.0, **extra}


@pytest.fixture
def harness(tmp_path: Path) -> Any:
    h = _Harness(tmp_path)
    yield h
    h.close()


@pytest.mark.parametrize("clock", [1000.0 + 3600, 100.0], ids=["box ahead", "box in 1970"])
def test_a_command_the_broker_held_to_its_expiry_does_not_ask_the_boxs_clock(
    tmp_path: Path, clock: float
) -> None:
    # The console at 1000 s sends a command that expires at 1030 s, with a 30 s MQTT 5
    # message expiry the broker counts down on its own clock. A box whose clock runs an
    # hour ahead once refused every such command; one in 1970 could not tell a stale one.
    h = _Harness(tmp_path, now=clock)
    try:
        h.send(_cmd("fresh", "ping", sent_at=1000.0, expires_at=1030.0), broker_expiry_s=29)
        assert h.final("fresh").status == "ok"
        # Without the broker's word, the box's clock is all there is.
        h.send(_cmd("bare", "ping", sent_at=1000.0, expires_at=1030.0))
        bare = h.final("bare")
        if clock > 1030.0:
            assert (bare.status, bare.error and bare.error.code) == ("error", "command.expired")
        else:
            assert bare.status == "ok"
    finally:
        h.close()


YEAR_S = 365 * 86400.0


@pytest.mark.parametrize(
    ("clock", "said", "fix"),
    [
        # A 3.1.1 box a year ahead: every command expires, resent or not; the clock is to blame.
        (
            1000.0 + YEAR_S,
            "this box's clock reads 1971-01-01T00:16:40Z, 365.0 days after it was sent",
            "check this box's clock (NTP",
        ),
        # Late by seconds: the command's lifetime was too short, not the clock wrong.
        (1035.0, "this box's clock reads 1970-01-01T00:17:15Z, 35 s after it was sent", ""),
    ],
    ids=["box a year ahead", "a few seconds late"],
)
def test_an_expired_command_is_told_against_the_box_clock(
    tmp_path: Path, clock: float, said: str, fix: str
) -> None:
    h = _Harness(tmp_path, now=clock)
    try:
        h.send(_cmd("late", "ping", sent_at=1000.0, expires_at=1030.0))
        error = h.final("late").error
        assert error is not None
        assert error.code == "command.expired"
        assert error.message.startswith(
            "command late expired at 1970-01-01T00:17:10Z (sent at 1970-01-01T00:16:40Z); "
        )
        assert said in error.message
        if fix:
            assert fix in error.message
        else:
            assert "NTP" not in error.message
            assert error.message.endswith("send it again with a later expires_at")
    finally:
        h.close()


def test_ping_answers_ok(harness: _Harness) -> None:
    harness.send(_cmd("c1", "ping"))
    answer = harness.final("c1")
    assert (answer.status, answer.result, answer.device_id) == ("ok", {"pong": True}, "dock-7")


@pytest.mark.parametrize(
    ("payload", "code", "field", "cid"),
    [
        (b"{not json", "command.invalid", None, ""),
        (b"[1, 2]", "command.invalid", None, ""),
        (json.dumps({"id": "c2", "type": "ping"}).encode(), "command.invalid", "sent_at", "c2"),
        (json.dumps(_cmd("c3", "fly")).encode(), "command.unknown", "type", "c3"),
        (
            json.dumps(_cmd("c4", "deploy_model", {"name": "m", "version": "newest"})).encode(),
            "command.invalid",
            "args.version",
            "c4",
        ),
        (json.dumps(_cmd("c5", "ping", expires_at=10.0)).encode(), "command.expired", None, "c5"),
        (json.dumps(_cmd("c6", "ping", colour=1)).encode(), "command.invalid", "colour", "c6"),
        (  # a name the store took and its manifest refused: installed after 30 minutes'
            # work, answered ok, and never readable (listed damaged for good)
            json.dumps(
                _cmd("c7", "calibrate", {"model": "m", "data": "d", "install_as": "Lobby_Cam"})
            ).encode(),
            "command.invalid",
            "args.install_as",
            "c7",
        ),
    ],
)
def test_bad_commands_get_an_error_naming_the_field(
    harness: _Harness, payload: bytes, code: str, field: str | None, cid: str
) -> None:
    harness.send(payload)
    answer = harness.final(cid)
    assert answer.error is not None
    assert (answer.status, answer.error.code, answer.error.field) == ("error", code, field)
    assert harness.supervisor.runs == []
    harness.send(_cmd("after", "ping"))
    assert harness.final("after").status == "ok"


def test_a_ten_megabyte_payload_is_refused_unread_with_its_id(harness: _Harness) -> None:
    payload = b'{"id": "big", "type": "ping", "args": {"x": "' + b"x" * 10_000_000 + b'"}}'
    harness.send(payload)
    answer = harness.final("big")
    assert answer.error is not None
    assert answer.error.code == "command.too_large"


def test_a_duplicate_runs_once_and_gets_the_same_answer(harness: _Harness) -> None:
    harness.send(_cmd("dup", "ping"))
    first = harness.final("dup")
    harness.send(_cmd("dup", "ping"))
    time.sleep(0.1)
    assert harness.supervisor.runs == ["ping"]
    assert [a for a in harness.answers if a.id == "dup"] == [first, first]


def test_a_duplicate_whose_answer_a_newer_agent_stored_gets_it_read_for_what_is_known(
    harness: _Harness,
) -> None:
    # After a downgrade the command log holds answers a newer edge-agent stored. One with a
    # field this version lacks raised, and the duplicate got `internal` with no id.
    newer = {"id": "old", "status": "ok", "device_id": "dock-7", "ts": 5.0,
             "result": {"pong": True}, "trace": "t-1"}  # fmt: skip
    assert harness.log.claim("old") == (True, None)
    harness.log.finish("old", json.dumps(newer).encode())
    assert harness.log.claim("bad") == (True, None)
    harness.log.finish("bad", b"{not json")
    harness.send(_cmd("old", "ping"))
    harness.send(_cmd("bad", "ping"))
    answer = harness.final("old")
    assert (answer.status, answer.result, answer.ts) == ("ok", {"pong": True}, 5.0)
    unreadable = harness.final("bad")
    assert unreadable.error is not None
    assert "not run again" in unreadable.error.message
    assert harness.supervisor.runs == []


def test_bugs_and_operator_errors_are_answered_and_serving_goes_on(harness: _Harness) -> None:
    harness.send(_cmd("bug", "get_status"))
    harness.send(_cmd("op", "list_models"))
    bug, op = harness.final("bug"), harness.final("op")
    assert bug.error is not None
    assert bug.error.code == "internal"
    assert op.error is not None
    assert op.error.code == "store.not_found"
    assert "reinstall" in op.error.message
    harness.send(_cmd("next", "ping"))
    assert harness.final("next").status == "ok"


def test_long_commands_go_accepted_progress_ok(harness: _Harness) -> None:
    harness.send(_cmd("d1", "deploy_model", {"name": "person-det"}))
    final = harness.final("d1")
    kinds = [a.status for a in harness.answers if a.id == "d1"]
    assert kinds[0] == "accepted"
    assert kinds[-1] == "ok"
    assert "progress" in kinds
    assert final.result == {"installed": "person-det"}


def test_progress_within_a_stage_is_sent_at_most_every_two_seconds(harness: _Harness) -> None:
    # A transfer reports every chunk: unthrottled, a fleet's group deploy buried its console.
    harness.supervisor.steps, harness.supervisor.step_s = 500, 0.0
    harness.send(_cmd("d9", "deploy_model", {"name": "m"}))
    assert harness.final("d9").status == "ok"
    sent = [a.progress for a in harness.answers if a.id == "d9" and a.status == "progress"]
    assert [(p.stage, p.fraction) for p in sent if p] == [("pull", 0.0), ("install", 0.0)]


def test_a_stop_interrupts_the_running_job_and_hands_back_the_queued_ones(
    tmp_path: Path,
) -> None:
    # A stop cancelled them as an operator's cancel does: the running deploy and each
    # queued one (started on the way out only to cancel itself) answered command.cancelled,
    # and a console restarting a group deploy took that for a cancel and sent nothing again.
    h = _Harness(tmp_path)
    h.supervisor.steps, h.supervisor.step_s = 1000, 0.05
    for cid in ("d1", "d2", "d3"):
        h.send(_cmd(cid, "deploy_model", {"name": "m"}))
    _until(lambda: any(a.id == "d1" and a.status == "progress" for a in h.answers))
    h.close()
    running = h.final("d1").error
    assert running is not None
    assert running.code == "command.interrupted"
    assert "did not finish" in running.message
    for cid in ("d2", "d3"):
        queued = h.final(cid).error
        assert queued is not None
        assert (queued.code, "was not run" in queued.message) == ("command.interrupted", True)
    assert h.supervisor.runs == ["deploy_model"]
    # The ones never run are not kept: the same ids run when sent again.
    again = CommandLog(tmp_path / "c.sqlite")
    assert again.claim("d2") == (True, None)
    assert again.claim("d1")[0] is False
    again.close()


def test_a_cancel_asked_before_a_stop_stays_the_answer(harness: _Harness) -> None:
    harness.supervisor.steps, harness.supervisor.step_s = 1000, 0.05
    harness.send(_cmd("d1", "deploy_model", {"name": "m"}))
    _until(lambda: any(a.id == "d1" and a.status == "progress" for a in harness.answers))
    job = harness.dispatcher.jobs
    assert job.cancel("d1") == "running"
    harness.dispatcher.close(1.0)
    final = harness.final("d1").error
    assert final is not None
    assert final.code == "command.cancelled"


def test_a_cancel_that_comes_while_a_job_is_answered_finds_nothing_to_cancel(
    harness: _Harness,
) -> None:
    # The job was listed running until its answer was stored and sent: a cancel handled
    # meanwhile was answered ok {"cancelled": ...} beside the job's own final answer.
    answering, go_on = threading.Event(), threading.Event()
    plain = harness.dispatcher._answer

    def slow(response: Response) -> None:
        if response.id == "d1" and response.status in ("ok", "error"):
            answering.set()
            go_on.wait(5)
        plain(response)

    harness.dispatcher._answer = slow
    harness.supervisor.steps = 1
    harness.send(_cmd("d1", "deploy_model", {"name": "m"}))
    assert answering.wait(5)
    harness.send(_cmd("c1", "cancel", {"id": "d1"}))
    go_on.set()
    cancel = harness.final("c1").error
    assert cancel is not None
    assert (cancel.code, cancel.field) == ("command.invalid", "args.id")
    assert harness.final("d1").status == "ok"


def test_cancel_stops_a_long_command(harness: _Harness) -> None:
    harness.supervisor.release.clear()
    harness.send(_cmd("d2", "deploy_model", {"name": "m"}))
    time.sleep(0.06)
    harness.send(_cmd("x", "cancel", {"id": "d2"}))
    assert harness.final("x").status == "ok"
    final = harness.final("d2")
    assert final.error is not None
    assert final.error.code == "command.cancelled"
    harness.send(_cmd("y", "cancel", {"id": "nothing"}))
    assert harness.final("y").status == "error"


def test_a_stuck_job_past_its_deadline_does_not_block_the_next() -> None:
    jobs = Jobs(deadline_s=0.2)
    done: list[str] = []
    hang = threading.Event()

    said: list[str] = []

    def stuck(job: JobContext) -> None:
        hang.wait(10)
        try:
            job.check()
        except EdgeAgentError as exc:
            said.append(f"{exc.code}: {exc.problem}")

    jobs.start("stuck", stuck, lambda s, f: None)
    jobs.start("next", lambda job: done.append("next"), lambda s, f: None)
    deadline = time.monotonic() + 3
    while not done and time.monotonic() < deadline:
        time.sleep(0.02)
    # Still listed while it runs on (get_status showed nothing of a job stuck for good),
    # and a cancel finds it.
    assert jobs.running() == ["stuck"]
    assert jobs.cancel("stuck")
    hang.set()
    assert done == ["next"]
    jobs.join(1.0)
    # Its next check says why it must stop: a bare "cancelled" answered a console that
    # had asked for no cancel.
    deadline = time.monotonic() + 3
    while not said and time.monotonic() < deadline:
        time.sleep(0.02)
    assert said == [
        "command.cancelled: cancelled: ran past the agent's job deadline of 0.2 s, and the "
        "queue moved on without it"
    ]
    _until(lambda: jobs.running() == [])


def test_a_duplicate_of_a_running_command_is_told_it_runs_and_runs_once(
    harness: _Harness,
) -> None:
    harness.supervisor.hold.clear()
    harness.send(_cmd("d3", "deploy_model", {"name": "m"}))
    harness.send(_cmd("d3", "deploy_model", {"name": "m"}))
    deadline = time.monotonic() + 2
    while len([a for a in harness.answers if a.id == "d3"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [a.status for a in harness.answers if a.id == "d3"] == ["accepted", "accepted"]
    harness.supervisor.hold.set()
    assert harness.final("d3").status == "ok"
    assert harness.supervisor.runs == ["deploy_model"]


def test_long_commands_past_the_queue_limit_are_busy_and_may_be_sent_again(
    harness: _Harness,
) -> None:
    harness.supervisor.release.set()  # each job finishes at once when let go
    harness.supervisor.hold.clear()
    for i in range(MAX_QUEUED_JOBS + 1):
        harness.send(_cmd(f"q{i}", "deploy_model", {"name": "m"}))
    harness.send(_cmd("over", "deploy_model", {"name": "m"}))
    busy = harness.final("over")
    assert busy.error is not None
    assert busy.error.code == "command.busy"
    harness.send(_cmd("ping", "ping"))
    assert harness.final("ping").status == "ok"  # short commands are not held up
    harness.supervisor.hold.set()
    for i in range(MAX_QUEUED_JOBS + 1):
        assert harness.final(f"q{i}", timeout=10).status == "ok"
    # Refused, not remembered: the same id runs when sent again.
    harness.send(_cmd("over", "deploy_model", {"name": "m"}))
    deadline = time.monotonic() + 5
    while harness.final("over").status != "ok" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert harness.final("over").status == "ok"


def test_a_cancel_past_the_point_of_no_return_is_refused_and_the_job_says_what_it_did(
    harness: _Harness,
) -> None:
    # Cancel once said ok here and the job's answer said command.cancelled, while the
    # model it was activating went live all the same.
    harness.send(_cmd("a1", "activate_model", {"name": "m", "version": 2}))
    assert harness.supervisor.committed.wait(5)
    harness.send(_cmd("x1", "cancel", {"id": "a1"}))
    refused = harness.final("x1")
    assert refused.error is not None
    assert (refused.error.code, refused.error.field) == ("command.busy", "args.id")
    assert "point of no return" in refused.error.message
    harness.supervisor.finish_commit.set()
    done = harness.final("a1")
    assert (done.status, done.result) == ("ok", {"activated": True})


def test_a_queued_job_cancelled_before_its_commit_changes_nothing(harness: _Harness) -> None:
    harness.supervisor.hold.clear()  # a deploy runs ahead; the activate waits behind it
    harness.send(_cmd("d1", "deploy_model", {"name": "m"}))
    harness.send(_cmd("a2", "activate_model", {"name": "m", "version": 2}))
    harness.send(_cmd("x2", "cancel", {"id": "a2"}))
    assert harness.final("x2").status == "ok"
    harness.supervisor.hold.set()
    cancelled = harness.final("a2")
    assert cancelled.error is not None
    assert cancelled.error.code == "command.cancelled"
    assert not harness.supervisor.committed.is_set()
    assert harness.final("d1").status == "ok"


def test_a_job_abandoned_at_its_deadline_that_then_finishes_answers_what_it_did(
    harness: _Harness,
) -> None:
    # Past its deadline the queue moves on and the job is told to stop; one that
    # finishes all the same did its work, and "cancelled" would hide that.
    harness.dispatcher.jobs.deadline_s = 0.1
    harness.supervisor.calibrate_s = 0.4
    harness.send(_cmd("c1", "calibrate", {"model": "m", "data": "pipeline:cam"}))
    done = harness.final("c1")
    assert (done.status, done.result) == ("ok", {"calibrated": True})


def test_a_command_log_that_cannot_be_written_costs_no_command_its_answer(
    harness: _Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # The real failure is a full state disk ("database or disk is full"); query_only
    # makes the log's own connection refuse every write the same way, and nothing else.
    harness.supervisor.release.set()
    harness.supervisor.hold.clear()
    harness.send(_cmd("inflight", "deploy_model", {"name": "m"}))  # claimed while it could be
    harness.log._db.execute("PRAGMA query_only = 1")
    with caplog.at_level(logging.ERROR):
        harness.send(_cmd("p1", "ping"))
        harness.send(_cmd("s1", "list_pipelines"))
        harness.send(_cmd("d1", "deploy_model", {"name": "m"}))
        harness.supervisor.hold.set()
        for cid in ("p1", "s1", "d1", "inflight"):  # inflight: its finish fails
            assert harness.final(cid).status == "ok", cid
    assert [a for a in harness.answers if a.id == ""] == []
    # Said once, not once per command: a full disk must not fill the journal too.
    assert caplog.text.count("command_log_failed") == 1
    assert "Traceback" not in caplog.text


def test_commands_that_come_while_the_agent_stops_are_answered_once_and_not_run(
    tmp_path: Path,
) -> None:
    h = _Harness(tmp_path)
    h.supervisor.hold.clear()
    h.send(_cmd("d0", "deploy_model", {"name": "m"}))  # running when the stop comes
    _until(lambda: h.supervisor.runs == ["deploy_model"])
    closing = threading.Thread(target=h.dispatcher.close, args=(2.0,))
    closing.start()
    _until(h.dispatcher._closed.is_set)  # inside close's wait for the running job
    h.send(_cmd("d1", "deploy_model", {"name": "m"}))
    h.send(_cmd("p1", "ping"))
    h.supervisor.hold.set()
    closing.join()
    try:
        for cid in ("d1", "p1"):
            answer = h.final(cid)
            assert answer.error is not None
            assert answer.error.code == "command.interrupted", cid
        # Queued after cancel_all, d1 once ran uncancelled while the pipelines closed.
        assert h.supervisor.runs == ["deploy_model"]
        assert [a for a in h.answers if a.id == ""] == []
        # Not left claimed: the next start would answer them a second time.
        assert h.log.unfinished() == []
    finally:
        h.log.close()


def test_ping_and_reads_are_answered_while_slow_short_commands_hold_every_worker(
    harness: _Harness,
) -> None:
    # Rollbacks waiting on the store's lock for a deploy (up to 900 s) once held all four
    # workers, and ping, get_status and list_* queued behind them.
    harness.supervisor.store_lock.clear()
    for i in range(MAX_WAITING_COMMANDS):
        harness.send(_cmd(f"r{i}", "rollback_model", {"name": "m"}))
    harness.send(_cmd("p1", "ping"))
    harness.send(_cmd("l1", "list_pipelines"))
    assert harness.final("p1", timeout=1.0).status == "ok"
    assert harness.final("l1", timeout=1.0).status == "ok"
    # The lane is full: said at once, not queued without end, and not kept.
    harness.send(_cmd("over", "rollback_model", {"name": "m"}))
    busy = harness.final("over", timeout=1.0)
    assert busy.error is not None
    assert busy.error.code == "command.busy"
    harness.supervisor.store_lock.set()
    for i in range(MAX_WAITING_COMMANDS):
        assert harness.final(f"r{i}").status == "ok"
    harness.send(_cmd("over", "rollback_model", {"name": "m"}))
    deadline = time.monotonic() + 5
    while harness.final("over").status != "ok" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert harness.final("over").status == "ok"


def test_a_disk_error_in_a_command_is_answered_with_its_code_and_fix(harness: _Harness) -> None:
    # Once `internal` ("a bug") with a traceback in the log, for a full disk.
    harness.send(_cmd("rm", "remove_model", {"name": "m", "version": 3}))
    answer = harness.final("rm")
    assert answer.error is not None
    assert answer.error.code == "path.unwritable"
    assert "/state/store/m/3" in answer.error.message
    assert "free space" in answer.error.message


@pytest.mark.parametrize(
    ("command", "code", "field", "named"),
    [
        (_cmd("e1", "ping", colour=1), "command.invalid", "colour", "does not know colour"),
        (
            _cmd("e2", "deploy_model", {"name": "m", "pin": True}),
            "command.invalid",
            "args.pin",
            "does not know args.pin",
        ),
        (_cmd("e3", "reboot"), "command.unknown", "type", "does not know command type 'reboot'"),
    ],
)
def test_what_a_newer_console_sends_is_answered_as_unknown_to_this_version(
    harness: _Harness, command: dict[str, Any], code: str, field: str, named: str
) -> None:
    # "Extra inputs are not permitted" left an operator unable to tell an old box from a
    # console bug; the code stays, for machines.
    harness.send(command)
    answer = harness.final(command["id"])
    assert answer.error is not None
    assert (answer.error.code, answer.error.field) == (code, field)
    assert f"edge-agent {__version__} {named}" in answer.error.message
    assert "upgrade the agent" in answer.error.message


def test_a_wrong_value_is_not_blamed_on_a_newer_console(harness: _Harness) -> None:
    harness.send(_cmd("w1", "deploy_model", {"name": "m", "version": "newest"}))
    answer = harness.final("w1")
    assert answer.error is not None
    assert answer.error.code == "command.invalid"
    assert "newer console" not in answer.error.message


def test_a_job_past_its_point_of_no_return_stays_past_it() -> None:
    # A deploy commits before its install and again before its activation; the deadline's
    # cancel (set on the flag, not asked) in between made the second commit raise, and an
    # installed model answered command.cancelled, never activated.
    job = JobContext.detached()
    job.commit()
    assert not job.request_cancel()  # asked: refused, too late
    job.cancel_event.set()  # the deadline's, which does not ask
    job.commit()  # still past it: no command.cancelled
    fresh = JobContext.detached()
    fresh.cancel_event.set()
    with pytest.raises(EdgeAgentError) as info:
        fresh.commit()
    assert info.value.code == "command.cancelled"


def test_a_command_that_expires_while_it_waits_its_turn_is_not_run(harness: _Harness) -> None:
    # The expiry was checked as the command arrived only: a deploy queued behind another
    # ran long after the console had given up on it ("after which the device must not
    # run it", the schema says).
    harness.supervisor.hold.clear()
    harness.send(_cmd("d1", "deploy_model", {"name": "m"}))
    harness.send(_cmd("a2", "activate_model", {"name": "m", "version": 2}, expires_at=1030.0))
    harness.dispatcher._clock = lambda: 1100.0  # the deploy ahead took a while
    harness.supervisor.hold.set()
    late = harness.final("a2")
    assert late.error is not None
    assert late.error.code == "command.expired"
    assert "while it waited its turn to run" in late.error.message
    assert harness.supervisor.runs == ["deploy_model"]
    assert harness.final("d1").status == "ok"


def test_the_command_log_keeps_the_claim_of_a_command_still_running(tmp_path: Path) -> None:
    # Trimmed to its newest ids whether answered or not, the log lost the claim of a long
    # command that many short ones passed; its answer was then stored nowhere, and a
    # resend ran it again.
    log = CommandLog(tmp_path / "c.sqlite", keep=5)
    assert log.claim("calibrate-1") == (True, None)
    for i in range(20):
        assert log.claim(f"ping-{i}") == (True, None)
        log.finish(f"ping-{i}", b"ok")
    assert log.claim("calibrate-1") == (False, None)  # still running: not run again
    log.finish("calibrate-1", b"done")
    assert log.claim("calibrate-1") == (False, b"done")
    assert log.claim("ping-0") == (True, None)  # answered ones are trimmed as before
    log.close()


def test_a_queued_job_cancelled_is_answered_at_once_and_gives_up_its_place(
    harness: _Harness,
) -> None:
    # Cancelled while queued, it stayed in the queue, holding a place and its answer until
    # every job ahead of it had run (each up to its 30-minute deadline).
    harness.supervisor.hold.clear()
    harness.send(_cmd("d1", "deploy_model", {"name": "m"}))
    harness.send(_cmd("a2", "activate_model", {"name": "m", "version": 2}))
    _until(lambda: harness.dispatcher.jobs.running() == ["d1", "a2"])
    harness.send(_cmd("x2", "cancel", {"id": "a2"}))
    cancelled = harness.final("a2")  # with the deploy ahead still running
    assert cancelled.error is not None
    assert cancelled.error.code == "command.cancelled"
    assert harness.final("x2").status == "ok"
    assert harness.dispatcher.jobs.running() == ["d1"]
    harness.supervisor.hold.set()
    assert harness.final("d1").status == "ok"
    assert harness.supervisor.runs == ["deploy_model"]
