"""native_stderr_held from many threads at once: fd 2 comes back, no log line is lost.

Each case runs in a child Python whose fd 2 is a file here, so what reaches the "real"
stderr can be read back and pytest's own capture of fd 2 is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_CHURN = r"""
import json, logging, os, threading
from edge_agent.logs import setup_logging
from edge_agent.quiet import native_stderr_held

setup_logging(verbosity=1)
log = logging.getLogger("edge_agent.test")
before = os.fstat(2)
THREADS, ROUNDS = 16, 60  # 960 holds overlapping; 200 rounds took 10 to 50 s
start = threading.Barrier(THREADS + 1)


def churn() -> None:
    start.wait()
    for i in range(ROUNDS):
        try:
            with native_stderr_held():
                if i % 2:
                    os.write(2, b"chatter-kept\n")
                else:
                    os.write(2, b"chatter-dropped\n")
                    raise ValueError
        except ValueError:
            pass


threads = [threading.Thread(target=churn) for _ in range(THREADS)]
for t in threads:
    t.start()
start.wait()
n = 0
while any(t.is_alive() for t in threads):
    log.warning("during-%d", n)
    n += 1
for t in threads:
    t.join()
after = os.fstat(2)
log.warning("after-churn")
os.write(2, b"native-after\n")
print(json.dumps({
    "during": n,
    "same_fd2": (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino),
}))
"""

_SINGLE = r"""
import json, logging, os, sys
from edge_agent.logs import setup_logging
from edge_agent.quiet import native_stderr_held

setup_logging(verbosity=1)
log = logging.getLogger("edge_agent.test")
before = os.fstat(2)
stderr = sys.stderr
handler = logging.getLogger().handlers[-1]

with native_stderr_held():
    os.write(2, b"kept-on-success\n")
try:
    with native_stderr_held():
        log.warning("logged-inside-failed-hold")
        os.write(2, b"dropped-on-error\n")
        raise RuntimeError
except RuntimeError:
    pass
with native_stderr_held():
    os.write(2, b"outer-kept\n")
    try:
        with native_stderr_held():
            os.write(2, b"inner-dropped\n")
            raise KeyError
    except KeyError:
        pass
after = os.fstat(2)
os.write(2, b"native-after\n")
print(json.dumps({
    "same_fd2": (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino),
    "same_streams": sys.stderr is stderr and handler.stream is stderr,
}))
"""


def _run(script: str, tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    err = tmp_path / "stderr.txt"
    repo = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    with err.open("wb") as fd2:
        done = subprocess.run(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=fd2,
            env=env,
            cwd=repo,
            timeout=300,
            check=False,
        )
    lines = err.read_text(errors="replace").splitlines()
    assert done.returncode == 0, lines[-20:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result, lines


def _msg(line: str) -> str:
    return line.split("msg=", 1)[1] if "msg=" in line else line


def test_concurrent_holds_restore_fd2_and_lose_no_log_line(tmp_path: Path) -> None:
    result, lines = _run(_CHURN, tmp_path)
    assert result["same_fd2"], "fd 2 was left pointing somewhere else"
    messages = [_msg(line) for line in lines]
    during = {m for m in messages if m.startswith("during-")}
    missing = [i for i in range(result["during"]) if f"during-{i}" not in during]
    assert not missing, f"{len(missing)} of {result['during']} log lines lost during the churn"
    assert "after-churn" in messages
    assert "native-after" in messages
    assert "chatter-dropped" not in messages
    # Nothing else: every line whole, no interleaved fragments.
    assert set(messages) - during <= {"after-churn", "native-after", "chatter-kept"}


def test_single_holder_keeps_on_success_and_drops_on_error(tmp_path: Path) -> None:
    result, lines = _run(_SINGLE, tmp_path)
    messages = [_msg(line) for line in lines]
    assert result == {"same_fd2": True, "same_streams": True}
    assert messages == [
        "kept-on-success",
        # Python's logging is ours, not native chatter: it goes out even from a failed hold.
        "logged-inside-failed-hold",
        "outer-kept",
        "native-after",
    ]
