"""What a fleet of joins costs `edge-fleet serve`: the broadcast's join and leave, in-process.

After a broker outage every box of a fleet rejoins within seconds, each join under the
server's lock, which also paces the frames and takes the acks. A join adds the box's
bitmap of missing chunks to the count of boxes that need each chunk, and a leave takes it
away; the baseline is the per-chunk loop that did it before (what a user would write).

    python tools/bench_broadcast_joins.py                    # 5,000 boxes, a 1 GB model
    python tools/bench_broadcast_joins.py --boxes 500 --size-mb 100
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import cpu_flags, flags_text, load_average  # noqa: E402

from edge_agent.catalog.catalog import default_models_dir  # noqa: E402
from edge_agent.catalog.manifest import load_manifest  # noqa: E402
from edge_agent.delivery.broadcast import Broadcast, BroadcastOptions  # noqa: E402
from edge_agent.delivery.chunks import ChunkMap  # noqa: E402
from edge_agent.protocol.delivery import Join, Leave, bit, bitmap, encode_bits  # noqa: E402
from edge_agent.store.release import MAX_CHUNK, Release  # noqa: E402


def _release(chunks: int) -> Release:
    digest = hashlib.sha256(b"bench").hexdigest()
    now = datetime.now(UTC)
    return Release(
        name="m",
        version=1,
        model="m.onnx",
        files=[
            {
                "path": "m.onnx",
                "sha256": digest,
                "size": chunks * MAX_CHUNK,
                "chunks": [digest] * chunks,
            }
        ],
        format="onnx",
        precision="f32",
        chunk_size=MAX_CHUNK,
        created_at=now,
        expires_at=now + timedelta(days=1),
        key_id="0" * 16,
        manifest=load_manifest(default_models_dir() / "text-orientation.toml"),
    )


def _naive(joins: list[Join], n: int) -> float:
    """The per-chunk loop over each bitmap, joins then leaves; seconds."""
    from edge_agent.protocol.delivery import decode_bits

    demand = [0] * n
    started = time.perf_counter()
    kept = []
    for join in joins:
        needed = decode_bits(join.missing, n)
        assert needed is not None
        for i in range(n):
            if bit(needed, i):
                demand[i] += 1
        kept.append(needed)
    for needed in kept:
        for i in range(n):
            if bit(needed, i):
                demand[i] -= 1
    return time.perf_counter() - started


def _broadcast(joins: list[Join], chunks: ChunkMap) -> float:
    options = BroadcastOptions(max_pullers=len(joins) + 1)
    cast = Broadcast(chunks, lambda i: b"", lambda f: None, lambda s: None, "s1", options)
    started = time.perf_counter()
    for join in joins:
        cast.join(join, 0.0)
    for join in joins:
        cast.leave(Leave(device_id=join.device_id, reason="cancelled"))
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boxes", type=int, default=5000)
    parser.add_argument("--size-mb", type=float, default=1024.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = max(1, int(args.size_mb * 2**20) // MAX_CHUNK)
    chunks = ChunkMap(_release(n))
    every = encode_bits(bitmap(n, range(n)))
    joins = [
        Join(device_id=f"box-{i}", release_id=chunks.id, chunks=n, missing=every)
        for i in range(args.boxes)
    ]
    print(flags_text(cpu_flags()))
    print(f"{args.boxes} boxes join and leave a release of {n} chunks ({args.size_mb:g} MB)")
    naive_joins = joins[: max(1, args.boxes // 20)]  # the loop is slow: a twentieth, scaled
    for r in range(args.rounds):
        ours = _broadcast(joins, chunks)
        naive = _naive(naive_joins, n) * len(joins) / len(naive_joins)
        print(
            f"round {r + 1}: edge-fleet {ours:.3f} s ({1e3 * ours / len(joins):.3f} ms a box), "
            f"per-chunk loop {naive:.2f} s ({1e3 * naive / len(joins):.3f} ms a box): "
            f"{naive / ours:.0f}x; load {load_average()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
