"""What a put costs once the outbox is full: the state of every box through a long outage.

Fills an outbox to its quota with results the size of a detection's (300 bytes), then
times puts that each evict the oldest result to make room, and puts of a retained
message that replaces the one before it (Home Assistant's states). Before the outbox kept
its byte counts by priority, a put over a full 64 MB quota summed the table: 78 ms, on the
pipelines' threads. Prints the CPU flags and the load average beside the figures; run it
on a quiet machine. About 10 s at the default 64 MB:

    python tools/bench_outbox.py [--quota-mb 64] [--puts 500]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchlib import consoles, load_average, print_machine

from edge_agent import __version__
from edge_agent.outbox import Outbox, Priority

RESULT = b"r" * 300
TOPIC = "edge/v1/dock-7/results/cam"


def _time_puts(outbox: Outbox, puts: int, retain: bool) -> list[float]:
    """Milliseconds per put, each timed on its own."""
    occupancy = ("edge/v1/dock-7/occupancy/cam/person", Priority.CRITICAL)
    topic, priority = occupancy if retain else (TOPIC, Priority.RESULT)
    times = []
    for _ in range(puts):
        start = time.perf_counter()
        outbox.put(topic, RESULT, priority, retain=retain)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota-mb", type=float, default=64.0, help="the outbox quota")
    parser.add_argument("--puts", type=int, default=500, help="puts timed at the full quota")
    args = parser.parse_args()
    out, _ = consoles(100)
    print_machine(out, {"edge-agent": __version__})
    with tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp:
        outbox = Outbox(Path(tmp) / "outbox.sqlite", int(args.quota_mb * 1024 * 1024))
        start = time.perf_counter()
        while outbox.stats().dropped_result == 0:  # full once it has had to evict
            for _ in range(1_000):
                outbox.put(TOPIC, RESULT, Priority.RESULT)
        filled = time.perf_counter() - start
        stats = outbox.stats()
        disk = sum(f.stat().st_size for f in Path(tmp).iterdir())
        out.print(
            f"filled to {disk / 2**20:.2f} of {args.quota_mb:g} MB on disk: "
            f"{stats.bytes / 2**20:.2f} MB of messages ({stats.depth} results) in {filled:.1f} s"
        )
        for what, retain in (("result, evicting the oldest", False), ("retained", True)):
            times = sorted(_time_puts(outbox, args.puts, retain))
            p95 = times[int(0.95 * (len(times) - 1))]
            out.print(
                f"put at the full quota, {what}: median {statistics.median(times):.3f} ms, "
                f"p95 {p95:.3f} ms ({args.puts} puts)"
            )
        outbox.close()
    out.print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
