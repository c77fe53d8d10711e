"""Which models the agent has compiled right now, and where they run.

The `state` message and telemetry say, for each model, the device it runs on,
the precision it runs at and why a requested device was passed over; the
compile report knows all three. This pool remembers the report of every model
its pipelines hold, by the name they asked for, and forgets it with the last
user, so what is reported is what serves frames (a swapped-in model included).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from edge_agent.catalog.catalog import Catalog, ResolvedModel
from edge_agent.runtime.base import CompiledModel, CompileReport, RuntimeOptions
from edge_agent.runtime.pool import ModelPool


@dataclass(slots=True)
class _Held:
    name: str
    model: CompiledModel
    users: int
    since: int


class TrackedPool(ModelPool):
    """A `ModelPool` that knows the compile report of each model in use, by name."""

    def __init__(self, catalog: Catalog) -> None:
        super().__init__(catalog)
        self._held: dict[int, _Held] = {}
        self._track_lock = threading.Lock()
        self._order = 0

    def acquire(
        self, model: str, backend: str, options: RuntimeOptions
    ) -> tuple[CompiledModel, ResolvedModel]:
        compiled, resolved = super().acquire(model, backend, options)
        with self._track_lock:
            self._order += 1
            held = self._held.get(id(compiled))
            if held is None:
                self._held[id(compiled)] = _Held(model, compiled, 1, self._order)
            else:
                held.users += 1
                held.since = self._order
        return compiled, resolved

    def release(self, model: CompiledModel) -> None:
        with self._track_lock:
            held = self._held.get(id(model))
            if held is not None:
                held.users -= 1
                if held.users <= 0:
                    del self._held[id(model)]
        super().release(model)

    def reports(self) -> dict[str, CompileReport]:
        """The compile report of each model name in use; the latest compile wins a tie."""
        with self._track_lock:
            held = sorted(self._held.values(), key=lambda h: h.since)
        return {h.name: h.model.report for h in held}
