"""Ctrl-C during start-up: a real SIGINT to a real `edge-agent` at each moment before frames flow.

The promise (cli/main.py, cli/stopping.py, cli/pipeline_cmd.py): a Ctrl-C never shows a
traceback. Before the pipeline runs the process ends with one line, `edge-agent:
interrupted` or `edge-agent: stopped by SIGINT before the pipeline started`; once it runs,
the summary so far is printed with `stopped by SIGINT after N frames`. Either way the exit
code is 130, and the process is gone within a few seconds.

Each moment is reached, not guessed at with a sleep:
- the CLI's own imports, the native initialisation of an extension, the instant fd 2 is
  redirected to hold native output, the start of each thread: the child runs through
  LAUNCHER, which pauses it there and writes a marker; the test waits for the marker, then
  sends SIGINT (like `kill -INT`);
- the model's conversion and compile, each hundreds of milliseconds: the cache is fresh, so
  the process converts the model (while its fd 2 is held on a deleted temporary file,
  visible in /proc) and compiles it (OpenVINO creates `compiled/` as it starts);
- the first frame: its JSON line on stdout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.fetch import model_path
from edge_agent.clips import write_walk
from tests.cli_kit import STACKS_WAIT_S, edge_agent_cli

MODEL = "person-ssdlite"
INTERRUPTED = "edge-agent: interrupted"
BEFORE_START = "edge-agent: stopped by SIGINT before the pipeline started"
STOPPED_RUNNING = re.compile(r"edge-agent: stopped by SIGINT after (\d+) frames")
RUST_PANIC = re.compile(
    r"thread '.*' \(\d+\) panicked at |failed to import `datetime` C API|note: |"
    r"stack backtrace:|\s+\d+: |\s+at "
)
"""The lines of Rust's default panic report (pyo3's PanicException), backtrace included."""
CRASH_MARKS = (
    "Traceback",
    "terminate called",
    "Aborted",
    "Fatal Python error",
    "Exception ignored",
)

QUICK_EXIT_S = 3.0
"""Signal to exit when nothing slow is under way: the stop path's 2 s, and a second for
the summary and closing the engine on a loaded box."""
ENGINE_STEP_S = 15.0
"""Signal to exit during the conversion or the compile: the signal waits for the engine
call under way (0.6 s and 0.4 s on an idle box), so this is generous for a loaded one."""
REACH_S = 120.0
"""How long the process may take to reach the moment under test."""
HANG_S = 60.0
"""After the signal, how long before the process counts as hung (its stacks are taken)."""

LAUNCHER = r'''
"""`python -m edge_agent ARGS`, paused at one moment of its start-up until a SIGINT.

PAUSE_AT is import:MODULE (as MODULE starts importing), exec:MODULE (inside the native
initialisation of the extension MODULE), thread:NAME (as thread NAME starts) or dup2:FD
(just after the first os.dup2 onto FD). There the process writes PAUSE_MARK and waits: a
SIGINT whose handler raises (Python's default, the CLI's exit) ends the wait where it is,
as if it had arrived just then; one that only records itself ends when PAUSE_GO exists.
"""
import _imp
import os
import runpy
import signal
import sys
import threading
import time

kind, _, name = os.environ["PAUSE_AT"].partition(":")
mark, go = os.environ["PAUSE_MARK"], os.environ["PAUSE_GO"]
state = {"paused": False, "inside": False}


def note(text):
    with open(mark + ".tmp", "w") as f:
        f.write(text)
    os.replace(mark + ".tmp", mark)


def pause(moment):
    if state["paused"]:
        return
    state["paused"] = True
    note(moment)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)


if kind == "import":

    def audit(event, args):
        if event == "import" and args[0] == name:
            pause("importing " + name)

    sys.addaudithook(audit)
elif kind == "thread":
    start = threading.Thread.start

    def paused_start(self):
        if self.name == name:
            pause("starting thread " + name)
        start(self)

    threading.Thread.start = paused_start
elif kind == "exec":
    # A native initialisation runs no Python, but CPython checks for signals inside it
    # (PyObject_Repr does, and any Python it imports). A SIGALRM every 0.1 ms gets its
    # handler run at the first such check; pausing there puts the SIGINT inside the init.
    exec_dynamic = _imp.exec_dynamic

    def on_alarm(signum, frame):
        if state["inside"]:
            signal.setitimer(signal.ITIMER_REAL, 0)
            pause("inside the native init of " + name)

    def paused_exec(module):
        if module.__name__ != name or state["paused"]:
            return exec_dynamic(module)
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)
        state["inside"] = True
        try:
            return exec_dynamic(module)
        finally:
            state["inside"] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if not state["paused"]:
                note("missed: the init of " + name + " checked for no signal")

    _imp.exec_dynamic = paused_exec
elif kind == "dup2":
    dup2 = os.dup2

    def paused_dup2(fd, fd2, inheritable=True):
        moved = dup2(fd, fd2, inheritable)
        if fd2 == int(name):
            pause("fd " + name + " just pointed elsewhere")
        return moved

    os.dup2 = paused_dup2
else:
    raise SystemExit("PAUSE_AT must be import:, exec:, thread: or dup2:, not " + kind)
runpy.run_module("edge_agent", run_name="__main__", alter_sys=True)
'''


class Child:
    """One `edge-agent` process; its stdout and stderr are read as they come."""

    def __init__(self, cmd: list[str], env: Mapping[str, str]) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env)
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=_drain, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=_drain, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        """Poll `ready` until it holds; fail if the process ends or stalls first."""
        deadline = time.monotonic() + REACH_S
        while not ready():
            if self.proc.poll() is not None:
                self._join()
                pytest.fail(
                    f"edge-agent ended (exit {self.proc.returncode}) before {what}; "
                    f"stderr:\n{''.join(self.err)[-4000:]}"
                )
            if time.monotonic() > deadline:
                self._stacks_and_kill(f"did not reach {what} within {REACH_S:.0f} s")
            time.sleep(0.002)

    def interrupt(self, go: Path | None = None) -> tuple[str, str, float]:
        """SIGINT, like Ctrl-C or `kill -INT`; (stdout, stderr, seconds until it ended).

        `go` releases a process paused by LAUNCHER whose handler did not end the pause.
        """
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        if go is not None:
            go.touch()
        try:
            self.proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            self._stacks_and_kill(f"did not end within {HANG_S:.0f} s of SIGINT")
        took = time.monotonic() - sent
        self._join()
        return "".join(self.out), "".join(self.err), took

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._join()

    def _join(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10)

    def _stacks_and_kill(self, problem: str) -> None:
        self.proc.send_signal(signal.SIGUSR1)  # edge-agent answers with every thread's stack
        time.sleep(STACKS_WAIT_S)
        self.kill()
        raise AssertionError(
            f"{' '.join(self.cmd[-8:])} {problem}; stderr, thread stacks last:\n"
            f"{''.join(self.err)[-12000:]}"
        )


def _drain(stream: IO[str], into: list[str]) -> None:
    with stream:  # closed here, once the process has closed its end
        for line in stream:
            into.append(line)


def edge_agent(args: list[str], env: Mapping[str, str]) -> Child:
    return Child([sys.executable, "-m", "edge_agent", *args], env)


def paused_edge_agent(args: list[str], env: Mapping[str, str], at: str, tmp_path: Path) -> Child:
    paused = {**env, "PAUSE_AT": at, "PAUSE_MARK": str(tmp_path / "paused")}
    paused["PAUSE_GO"] = str(tmp_path / "go")
    return Child([sys.executable, "-c", LAUNCHER, *args], paused)


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_clean_exit(
    code: int, err: str, took: float, bound: float, codes: tuple[int, ...] = (130,)
) -> None:
    crashed = [mark for mark in CRASH_MARKS if mark in err]
    assert not crashed, f"{crashed[0]!r} on stderr, exit {code}:\n{err}"
    assert code in codes, f"exit {code}, wanted {codes}:\n{err}"
    assert took < bound, f"ended {took:.2f} s after SIGINT; {err}"


def assert_stopped_before_running(out: str, err: str, *allowed: str) -> None:
    """One line, one of `allowed`, and nothing on stdout."""
    lines = lines_of(err)
    assert len(lines) == 1, f"wanted one of {allowed} on stderr, got {err!r}"
    assert lines[0] in allowed, f"wanted one of {allowed} on stderr, got {err!r}"
    assert out == ""


def assert_stopped_running(out: str, err: str) -> int:
    """The start lines, then `stopped by SIGINT after N frames`, and on stdout N frames and
    the summary naming the signal. Returns N."""
    *start, last = lines_of(err) or [""]
    stopped = STOPPED_RUNNING.fullmatch(last)
    assert stopped, err
    assert start, err
    assert start[0].startswith(f"edge-agent: {MODEL} runs on "), err
    assert len(start) <= 2, err
    assert all(line.startswith("edge-agent: cli: decode on ") for line in start[1:]), err
    *frames, summary = [json.loads(line) for line in lines_of(out)]
    assert summary["signal"] == "SIGINT", summary
    assert all(set(frame) >= {"pipeline", "frame"} for frame in frames), frames
    assert summary["summary"]["frames"] == len(frames) == int(stopped.group(1)), summary
    return len(frames)


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 600 frames: a few seconds of work, so a run that ignored the signal would still end,
    # and be caught by its exit code and its output.
    return write_walk(tmp_path_factory.mktemp("walk") / "walk.avi", frames=600).path


@pytest.fixture
def fresh_cache(tmp_path: Path, resolve: Callable[[str], ResolvedModel]) -> Path:
    """A cache holding only the fetched model file: no IR, no compiled blob."""
    resolved = resolve(MODEL)  # fetched into the session's cache once
    cache = tmp_path / "cache"
    target = model_path(resolved.manifest, cache)
    target.parent.mkdir(parents=True)
    shutil.copyfile(resolved.path, target)
    return cache


def env_for(cache: Path, tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ, EDGE_AGENT_CACHE=str(cache), EDGE_AGENT_STATE_DIR=str(tmp_path / "state")
    )


def run_pipeline(walk: Path) -> list[str]:
    return ["run-pipeline", "--model", MODEL, "--source", str(walk), "--json"]


BENCH = ["bench", "--model", MODEL, "--json", "--time", "3"]


@pytest.mark.parametrize(
    ("module", "codes"),
    [
        # Still importing edge_agent.cli.main itself, before entry() is running. Python's own
        # answer would be to die of the signal (-2); a shell shows that as 130 too.
        pytest.param("edge_agent.cli.common", (130, -signal.SIGINT), id="cli-main-module"),
        pytest.param("edge_agent.cli.pull_cmd", (130,), id="building-the-parser"),
        pytest.param("edge_agent.pipelines.multi", (130,), id="command-modules"),
    ],
)
def test_ctrl_c_while_the_cli_loads_is_one_line_and_130(
    module: str, codes: tuple[int, ...], walk: Path, fresh_cache: Path, tmp_path: Path
) -> None:
    child = paused_edge_agent(
        run_pipeline(walk), env_for(fresh_cache, tmp_path), f"import:{module}", tmp_path
    )
    child.wait_until((tmp_path / "paused").exists, f"importing {module}")
    out, err, took = child.interrupt(tmp_path / "go")
    assert_clean_exit(child.proc.returncode, err, took, QUICK_EXIT_S, codes)
    if child.proc.returncode == 130:
        assert_stopped_before_running(out, err, INTERRUPTED)
    else:  # died of the signal: nothing was said
        assert (out, err) == ("", "")


@pytest.mark.parametrize(
    ("command", "module"),
    [
        pytest.param("run-pipeline", "openvino._pyopenvino", id="run-pipeline-openvino"),
        pytest.param("bench", "openvino._pyopenvino", id="bench-openvino"),
        # Imported while the parser is built; its init imports `datetime` for its C API.
        pytest.param("run-pipeline", "pydantic_core._pydantic_core", id="pydantic-core"),
        # doctor takes an engine that will not import in its stride ("openvino unusable")
        # and finishes: the Ctrl-C it swallowed used to end in exit 0 and that finding.
        pytest.param("doctor", "openvino._pyopenvino", id="doctor-openvino"),
    ],
)
def test_ctrl_c_inside_a_native_extension_init_is_one_line_and_130(
    command: str, module: str, walk: Path, fresh_cache: Path, tmp_path: Path
) -> None:
    """A signal that lands while an extension initialises surfaces from its import as
    something other than KeyboardInterrupt (pybind11: `ImportError: initialization failed`
    from it; PyO3: a PanicException); Ctrl-C is still Ctrl-C to the operator."""
    args = {"run-pipeline": run_pipeline(walk), "bench": BENCH, "doctor": ["doctor", "--json"]}
    child = paused_edge_agent(
        args[command], env_for(fresh_cache, tmp_path), f"exec:{module}", tmp_path
    )
    marker = tmp_path / "paused"
    child.wait_until(marker.exists, f"the native init of {module}")
    if marker.read_text().startswith("missed"):
        child.kill()
        pytest.skip(f"this build of {module} never checks for signals in its init")
    out, err, took = child.interrupt(tmp_path / "go")
    if module.startswith("pydantic_core"):
        # Rust's panic hook writes its own report to fd 2 before pyo3 raises (with a stack
        # under RUST_BACKTRACE): native text from before any of our code could hold fd 2.
        # Only that report is taken out; any other text still counts.
        err = "".join(ln for ln in err.splitlines(keepends=True) if not RUST_PANIC.match(ln))
    assert_clean_exit(child.proc.returncode, err, took, QUICK_EXIT_S)
    if command == "doctor":  # its report is out before the run ends; the exit says Ctrl-C
        out = ""
    assert_stopped_before_running(out, err, INTERRUPTED, BEFORE_START)


def native_output_held(pid: int) -> bool:
    """Whether the process's fd 2 is on quiet.native_stderr_held's temporary file, which
    it is while OpenVINO reads and converts the model file."""
    try:
        return str(Path(f"/proc/{pid}/fd/2").readlink()).endswith("(deleted)")
    except OSError:  # gone, or not yet
        return False


@pytest.mark.parametrize("step", ["converting", "compiling"])
@pytest.mark.parametrize("command", ["run-pipeline", "bench"])
def test_ctrl_c_during_the_model_compile_is_one_line_and_130(
    command: str, step: str, walk: Path, fresh_cache: Path, tmp_path: Path
) -> None:
    """The signal waits for the engine call under way (the model's conversion, or
    OpenVINO's compile, which creates `compiled/` as it starts); then run-pipeline leaves
    through exit_on_signals, bench through the KeyboardInterrupt path. The cache is left
    usable."""
    env = env_for(fresh_cache, tmp_path)
    child = edge_agent(run_pipeline(walk) if command == "run-pipeline" else BENCH, env)
    if step == "converting":
        child.wait_until(lambda: native_output_held(child.proc.pid), "the model conversion")
        # Clear of the instant the hold begins, which has a test of its own below; the
        # conversion goes on for hundreds of milliseconds more.
        time.sleep(0.1)
    else:
        child.wait_until((fresh_cache / "compiled").is_dir, "OpenVINO's compile")
    out, err, took = child.interrupt()
    assert_clean_exit(child.proc.returncode, err, took, ENGINE_STEP_S)
    expected = BEFORE_START if command == "run-pipeline" else INTERRUPTED
    assert_stopped_before_running(out, err, expected)

    # Nothing half-written is left for the next start to trip on: it runs, from this cache.
    assert not list((fresh_cache / "ir").glob(".convert-*"))
    for xml in (fresh_cache / "ir").glob("*.xml"):
        assert xml.with_suffix(".bin").is_file(), xml
    again = edge_agent_cli(*run_pipeline(walk), "--max-frames", "3", env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert len(lines_of(again.stdout)) == 4, again.stdout  # three frames and the summary


@pytest.mark.parametrize("command", ["run-pipeline", "bench"])
def test_ctrl_c_as_native_output_is_held_is_one_line_and_130(
    command: str, walk: Path, fresh_cache: Path, tmp_path: Path
) -> None:
    """quiet.native_stderr_held points fd 2 at a temporary file around the model read and
    back afterwards. A signal handled just after the redirect, before the hold has recorded
    itself, must not leave fd 2 there: the CLI's last line would go into that file."""
    args = run_pipeline(walk) if command == "run-pipeline" else BENCH
    child = paused_edge_agent(args, env_for(fresh_cache, tmp_path), "dup2:2", tmp_path)
    child.wait_until((tmp_path / "paused").exists, "fd 2 being redirected")
    out, err, took = child.interrupt(tmp_path / "go")
    assert_clean_exit(child.proc.returncode, err, took, QUICK_EXIT_S)
    expected = BEFORE_START if command == "run-pipeline" else INTERRUPTED
    assert_stopped_before_running(out, err, expected)


@pytest.mark.parametrize(
    "thread",
    [
        pytest.param("pipeline-run", id="run-starting"),  # the main thread starts the run
        pytest.param("read-cli", id="reader-starting"),  # the pipeline starts its reader
        pytest.param("infer-0", id="engine-starting"),  # the first frame goes to the engine
        pytest.param(None, id="first-frame-out"),
    ],
)
def test_ctrl_c_as_frames_start_prints_the_summary_and_130(
    thread: str | None, walk: Path, cache_dir: Path, tmp_path: Path
) -> None:
    env = env_for(cache_dir, tmp_path)  # compiled already: frames start soon
    if thread is None:
        child = edge_agent(run_pipeline(walk), env)
        child.wait_until(lambda: any('"frame"' in line for line in child.out), "a frame")
        out, err, took = child.interrupt()
    else:
        child = paused_edge_agent(run_pipeline(walk), env, f"thread:{thread}", tmp_path)
        child.wait_until((tmp_path / "paused").exists, f"thread {thread} starting")
        out, err, took = child.interrupt(tmp_path / "go")
    assert_clean_exit(child.proc.returncode, err, took, QUICK_EXIT_S)
    frames = assert_stopped_running(out, err)
    assert frames < 600, "the run went to the end of the video: the signal was lost"


def test_ctrl_c_as_bench_starts_measuring_is_one_line_and_130(
    cache_dir: Path, tmp_path: Path
) -> None:
    # The engine's workers start as the timed part begins; infer-1 after infer-0.
    child = paused_edge_agent(BENCH, env_for(cache_dir, tmp_path), "thread:infer-1", tmp_path)
    child.wait_until((tmp_path / "paused").exists, "thread infer-1 starting")
    out, err, took = child.interrupt(tmp_path / "go")
    assert_clean_exit(child.proc.returncode, err, took, QUICK_EXIT_S)
    assert_stopped_before_running(out, err, INTERRUPTED)
