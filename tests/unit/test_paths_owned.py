"""`Layout.owned` covers every path the layout builds, so that no pipeline can name one.

Pipelines started over MQTT are refused any path inside what `owned` lists
(`pipelines.confine`); a path added to the layout and left out of `owned` would be open
to them again. This walks the layout's own members, so a new one is checked unasked.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from edge_agent.paths import Layout


def _built(layout: Layout) -> dict[str, Path]:
    """Every path a member of the layout gives (one-argument members given a pipeline id)."""
    found: dict[str, Path] = {}
    for name, member in inspect.getmembers(Layout):
        if name.startswith("_") or name in ("cache", "state", "owned", "from_env"):
            continue
        if isinstance(member, property):
            value = getattr(layout, name)
        elif inspect.isfunction(member):
            value = getattr(layout, name)("cam")
        else:
            continue
        if isinstance(value, Path):
            found[name] = value
    return found


def test_every_path_the_layout_builds_is_inside_what_it_owns() -> None:
    layout = Layout(cache=Path("/var/cache/edge-agent"), state=Path("/var/lib/edge-agent"))
    owned = layout.owned()
    built = _built(layout)
    assert {"store", "transfers", "outbox", "agent", "captures", "regions"} <= built.keys()
    outside = {n: p for n, p in built.items() if not any(p.is_relative_to(o) for o in owned)}
    assert outside == {}


def test_the_state_folder_itself_is_not_owned_but_the_outbox_log_is() -> None:
    # Under systemd's sandbox the state folder is the one place sinks can write.
    layout = Layout(cache=Path("/c"), state=Path("/s"))
    owned = layout.owned()
    assert Path("/s") not in owned
    assert not any(Path("/s/results.jsonl").is_relative_to(o) for o in owned)
    assert {Path("/s/outbox.sqlite-wal"), Path("/s/outbox.sqlite-shm"), Path("/c")} <= set(owned)
