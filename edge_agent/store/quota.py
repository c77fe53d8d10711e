"""How many versions the store keeps: N per name and a byte quota, never current or previous.

Kept apart from the store's crash-safe mechanics: this is policy, which versions
may go and whether a new one fits, decided on the store's public view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_agent.errors import EdgeAgentError
from edge_agent.store.release import Release

if TYPE_CHECKING:
    from edge_agent.store.store import ModelStore

Version = tuple[str, int]


def usage(store: ModelStore) -> int:
    """Bytes the store's blobs take (shared bytes counted once)."""
    blobs = store.root / "blobs"
    return sum(b.stat().st_size for b in blobs.iterdir()) if blobs.is_dir() else 0


def evictable(store: ModelStore, pinned: set[Version]) -> list[Version]:
    """Versions that may go, oldest first within each name: never current or previous.

    A name whose state does not read has nothing evictable: which versions serve is
    unknown, and it must not fail the update of another name (`models verify` names it).
    """
    out = []
    for name in store.names():
        try:
            state = store.state(name)
        except EdgeAgentError:
            continue
        for version in store.versions(name):
            if version not in (state.current, state.previous) and (name, version) not in pinned:
                out.append((name, version))
    return out


def check_quota(store: ModelStore, release: Release) -> None:
    """Refuse `release` if it cannot fit even after evicting all that may go.

    Raises:
        EdgeAgentError: store.quota.
    """
    if store.quota_bytes is None:
        return
    blobs = store.root / "blobs"
    new = sum({f.sha256: f.size for f in release.files if not (blobs / f.sha256).exists()}.values())
    freeable = sum(_size(store, n, v) for n, v in evictable(store, set()))
    if usage(store) - freeable + new > store.quota_bytes:
        raise EdgeAgentError(
            f"{release.name} v{release.version} needs {new} bytes and the store's quota "
            f"of {store.quota_bytes} bytes is taken by current and previous versions",
            "remove versions, or raise the store quota",
            "store.quota",
        )


def evict(store: ModelStore, pinned: set[Version], remove: Callable[[str, int], None]) -> None:
    """Remove the oldest evictable versions until each name has at most `store.keep`
    and the blobs fit `store.quota_bytes`."""
    candidates = evictable(store, pinned)
    for name in {n for n, _ in candidates}:
        theirs = [v for n, v in candidates if n == name]
        excess = len(store.versions(name)) - store.keep
        for version in theirs[: max(0, excess)]:
            remove(name, version)
            candidates.remove((name, version))
    while store.quota_bytes is not None and usage(store) > store.quota_bytes and candidates:
        remove(*candidates.pop(0))


def _size(store: ModelStore, name: str, version: int) -> int:
    """A version's bytes, or 0 when its release does not read (damaged, or written by a
    newer edge-agent): counted as not freeable, so the quota errs toward refusing."""
    try:
        return store.release(name, version).release.total_size
    except EdgeAgentError:
        return 0
