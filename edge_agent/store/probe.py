"""Child-process entry of the health gate: `python -m edge_agent.store.probe REPORT.json`.

Reads a `ProbeRequest` as JSON on stdin, writes a `HealthReport` to REPORT.json.
A crash or a hang here is itself the verdict; the parent reads a missing report
as a failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

from edge_agent.privacy import disable_usage_telemetry
from edge_agent.store.health import ProbeRequest, check


def main(argv: list[str]) -> int:
    disable_usage_telemetry()
    request = ProbeRequest.model_validate_json(sys.stdin.buffer.read())
    report = check(request)
    Path(argv[0]).write_text(report.model_dump_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
