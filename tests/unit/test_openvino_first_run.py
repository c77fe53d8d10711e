"""Two infer requests making their first run at the same moment must not deadlock.

pyopenvino fills a dtype table in a C++ function-local static on first use and runs Python
inside its guard; two threads reaching it together deadlock on the guard and the GIL, and
every Python thread of the process stops. Importing our OpenVINO backend fills the table
first. The child below makes the race as likely as it gets (a one-microsecond GIL switch
interval, both threads released by one barrier): without the warm-up line in
`openvino_backend`, about half of such children hung on this machine, and three runs of
this test in a row failed; with it, none hang.
"""

from __future__ import annotations

import sys
import textwrap

from tests.cli_kit import run_bounded

_CHILD = textwrap.dedent(
    """
    import faulthandler, signal, sys, threading
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.setswitchinterval(1e-6)
    import numpy as np
    import openvino as ov
    import edge_agent.runtime.openvino_backend  # the import under test

    p = ov.opset13.parameter([1, 8], ov.Type.f32)
    compiled = ov.Core().compile_model(ov.Model([ov.opset13.relu(p)], [p]), "CPU")
    requests = [compiled.create_infer_request() for _ in range(2)]
    gate = threading.Barrier(2)
    x = np.full((1, 8), -1.0, np.float32)
    results = []

    def first_run(request):
        gate.wait()
        results.append(request.infer({0: x})[0])

    threads = [threading.Thread(target=first_run, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all((r == 0).all() for r in results), results
    print("both ran")
    """
)


def test_two_first_runs_at_once_do_not_deadlock() -> None:
    # Fresh processes: the table is filled once per process, so only a first run can race.
    for _ in range(6):
        proc = run_bounded([sys.executable, "-c", _CHILD], timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "both ran"
