"""Running edge-agent as a user does, in a child process, with a bound on the wait.

When a child outlives its timeout, it is asked for its thread stacks first
(SIGUSR1, which edge-agent answers with faulthandler on stderr) and killed only
then, so the failure shows where every thread was stuck instead of a bare
TimeoutExpired.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from edge_agent.errors import CODES

STACKS_WAIT_S = 1.0
"""How long a stuck child gets to write its stacks before it is killed."""


def run_bounded(
    cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True)` that fails with the child's
    thread stacks if it has not ended after `timeout` seconds."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(STACKS_WAIT_S)
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} did not end within {timeout:.0f} s; its stdout ended with "
            f"{out[-500:]!r}; its stderr, thread stacks last:\n{err[-12000:]}"
        ) from None
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def edge_agent_cli(
    *args: str, timeout: float = 300.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m edge_agent ARGS`, bounded as `run_bounded` says."""
    return run_bounded(
        [sys.executable, "-m", "edge_agent", *args],
        timeout=timeout,
        env=os.environ if env is None else env,
    )


def one_line_error(
    proc: subprocess.CompletedProcess[str], *needles: str, prog: str = "edge-agent"
) -> str:
    """The CLI's promise for a bad input: exit 2 and one `PROG: error: problem; fix [code]`
    line on stderr, holding each of `needles`, with no traceback. Returns the code."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith(f"{prog}: error: "), line
    for needle in needles:
        assert needle in line, line
    assert "; " in line, f"no fix in {line!r}"
    code = line.rsplit(" [", 1)[1].rstrip("]")
    assert code in CODES, line
    return code
