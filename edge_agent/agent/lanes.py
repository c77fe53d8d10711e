"""A lane: a small pool of command workers with a bounded backlog.

Short commands are not all short: rollback and remove wait on the store's lock for as
long as a deploy holds it, start_pipeline compiles, doctor loads every engine. On one
pool of four workers with an unbounded queue, four of those (or a storm of anything)
left ping and get_status waiting behind them, and a console took a healthy box for a
dead one. The dispatcher runs the cheap reads on a lane of their own, and a lane that
is full says so (command.busy) instead of queueing without end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class Lane:
    """Workers that take at most `limit` tasks, running and waiting together. Thread-safe.

    Args:
        name: Prefix of the worker threads' names.
        workers: How many run at once.
        limit: How many may be running or waiting; `submit` past it is refused.
    """

    def __init__(self, name: str, workers: int, limit: int) -> None:
        self.limit = limit
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._taken = 0

    def submit(self, task: Callable[[], None]) -> bool:
        """Run `task` on a worker; False, and nothing run, when the lane is full.

        Raises:
            RuntimeError: after `shutdown`.
        """
        with self._lock:
            if self._taken >= self.limit:
                return False
            self._taken += 1
        try:
            future = self._pool.submit(task)
        except RuntimeError:
            self._release()
            raise
        future.add_done_callback(self._done)  # cancelled ones at shutdown included
        return True

    def _done(self, _future: Future[None]) -> None:
        self._release()

    def _release(self) -> None:
        with self._lock:
            self._taken -= 1

    def shutdown(self) -> None:
        """Take no more; drop what waits; what runs finishes on its own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
