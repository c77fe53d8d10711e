"""Compiled models shared between pipelines.

Two pipelines on the same model, device and options share one compiled model
(and so one set of infer requests), instead of paying compile time and memory
twice. A model is closed, its memory given back, when its last user lets go:
the runs still in flight finish first (`CompiledModel.close` waits for them).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from edge_agent.catalog.catalog import Catalog, ResolvedModel
from edge_agent.logs import log_event
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import CompiledModel, RuntimeOptions

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    model: CompiledModel
    resolved: ResolvedModel
    users: int


class ModelPool:
    """Compile once per (model, backend, options); count users."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._entries: dict[tuple[str, str, str], _Entry] = {}
        self._lock = threading.Lock()

    def acquire(
        self, model: str, backend: str, options: RuntimeOptions
    ) -> tuple[CompiledModel, ResolvedModel]:
        """Return a compiled model, compiling it if no pipeline holds it yet.

        Keyed by the file the name resolves to now, not the name: after the store
        activates a new version of a name, acquiring it compiles the new version
        instead of handing back the old one still held by a running pipeline.
        """
        resolved = self.catalog.resolve(model)
        key = (str(resolved.path), backend, options.model_dump_json())
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.users += 1
                return entry.model, entry.resolved
        # Compile outside the lock: a slow compile must not stall other pipelines.
        compiled = create_backend(backend).compile(resolved.path, resolved.manifest, options)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(compiled, resolved, 0)
            entry.users += 1
        if entry.model is not compiled:
            compiled.close()  # another thread's compile of the same key won the race
        else:
            _say_fallback(model, compiled)
        return entry.model, entry.resolved

    def release(self, model: CompiledModel) -> None:
        """Let go of a model from `acquire`; the last user's release closes it."""
        last = False
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.model is model:
                    entry.users -= 1
                    if entry.users <= 0:
                        del self._entries[key]
                        last = True
                    break
        # Outside the lock: closing waits for the model's runs in flight, which must
        # not hold up other pipelines acquiring or releasing their models.
        if last:
            model.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _say_fallback(model: str, compiled: CompiledModel) -> None:
    """A requested device passed over, once per compile, where the service's journal shows
    it (WARNING): it was only in the state and telemetry, and a box running on its CPU
    what it was meant to run on its NPU was silent in the journal."""
    report = compiled.report
    if report.fallbacks:
        log_event(
            log,
            logging.WARNING,
            "device_fallback",
            model=model,
            requested=report.requested,
            used=report.device,
            reason="; ".join(f"{f.device}: {f.reason}" for f in report.fallbacks),
        )
