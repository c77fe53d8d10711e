"""Which models the agent has compiled right now, and where they run.

The `state` message and telemetry say, for each model, the device it runs on,
the precision it runs at and why a requested device was passed over; the
compile report knows all three. This pool remembers the report of every model
its pipelines hold, by the name they asked for (every compile of a name: one per
device, engine and options), and drops it with the last user, so what is reported
is what serves frames (a swapped-in model included). `last_report` keeps it a
while longer, for telemetry about frames a model served just before a swap
retired it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from edge_agent.catalog.catalog import Catalog, ResolvedModel
from edge_agent.runtime.base import CompiledModel, CompileReport, RuntimeOptions
from edge_agent.runtime.pool import ModelPool

_KEEP_LAST = 64
"""Names whose last report is kept: far more than the models one box runs at once."""


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
        # The latest report of each name, kept after its last user lets go: telemetry
        # names the model of a pipeline's latest frame, which a swap may just have retired.
        self._last: OrderedDict[str, CompileReport] = OrderedDict()

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
            self._last[model] = compiled.report
            self._last.move_to_end(model)
            while len(self._last) > _KEEP_LAST:
                self._last.popitem(last=False)
        return compiled, resolved

    def release(self, model: CompiledModel) -> None:
        with self._track_lock:
            held = self._held.get(id(model))
            if held is not None:
                held.users -= 1
                if held.users <= 0:
                    del self._held[id(model)]
        super().release(model)

    def compiles(self) -> dict[str, list[CompileReport]]:
        """The compile reports of each model name in use, one per model held, latest last.

        All of them, not one per name: two pipelines on one name hold two compiles when
        their device, engine or options differ, and the state keeping only the latest hid
        one that fell back from its GPU behind another's later compile on the CPU.
        """
        with self._track_lock:
            held = sorted(self._held.values(), key=lambda h: h.since)
        found: dict[str, list[CompileReport]] = {}
        for h in held:
            found.setdefault(h.name, []).append(h.model.report)
        return found

    def reports(self) -> dict[str, CompileReport]:
        """The compile report of each model name in use; the latest compile wins a tie."""
        return {name: reports[-1] for name, reports in self.compiles().items()}

    def last_report(self, name: str) -> CompileReport | None:
        """The report of the latest model acquired as `name`, in use or not (the last
        `_KEEP_LAST` names only)."""
        with self._track_lock:
            return self._last.get(name)
