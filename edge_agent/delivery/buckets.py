"""Token buckets by key (a device id), in fixed memory; pure: the caller says what time it is.

The fleet side limits what one device id may ask of it (repair requests, joins). A
device id is whatever a message says, so the buckets must not grow with the ids a
sender invents: past `max_keys`, the bucket used least recently is forgotten. That
gives its owner a full bucket again, which only ever lets more through, never less.
"""

from __future__ import annotations

from collections import OrderedDict


class TokenBuckets:
    """One bucket of `capacity` tokens per key, refilled at `per_s` tokens a second.

    Args:
        capacity: The burst: tokens a key that was quiet for long has.
        per_s: Tokens given back each second, up to `capacity`.
        max_keys: Keys held at most (the least recently used go first).
    """

    def __init__(self, capacity: float, per_s: float, max_keys: int) -> None:
        if capacity <= 0 or per_s <= 0 or max_keys < 1:
            raise ValueError("a token bucket needs a capacity, a rate and room for a key")
        self.capacity = capacity
        self.per_s = per_s
        self.max_keys = max_keys
        self._held: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str, now: float, tokens: float = 1.0) -> bool:
        """Take `tokens` from `key`'s bucket if it holds them; False (nothing taken) if not."""
        left, then = self._level(key, now)
        self._held.pop(key, None)  # back in at the end: the most recently used
        taken = left >= tokens
        self._held[key] = (left - tokens if taken else left, then)
        if len(self._held) > self.max_keys:
            self._held.popitem(last=False)
        return taken

    def wait(self, key: str, now: float, tokens: float = 1.0) -> float:
        """Seconds from `now` until `key`'s bucket holds `tokens` (0.0: it does now)."""
        left, _ = self._level(key, now)
        return max(0.0, (tokens - left) / self.per_s)

    def _level(self, key: str, now: float) -> tuple[float, float]:
        """`key`'s tokens at `now`, refilled since it was last used, and the time they are
        counted at."""
        left, then = self._held.get(key, (self.capacity, now))
        # A clock that stepped back gives nothing back and takes nothing away.
        return min(self.capacity, left + max(0.0, now - then) * self.per_s), max(now, then)

    def forget(self, key: str) -> None:
        """Give `key` a full bucket again."""
        self._held.pop(key, None)

    def __len__(self) -> int:
        return len(self._held)
