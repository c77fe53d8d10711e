"""Several pipelines in one process: built on one `ModelPool`, run together, stopped together.

Pipelines on the same model, backend and options share one compiled model, and so
one set of infer requests; each keeps its own source (with its own `fps_cap`),
events and sinks. Nothing here schedules frames: each pipeline's reader submits
when a request is free, waiting on equal terms with the others in the runtime's
bounded queue, so no stream starves another (tests/integration/test_capacity.py
checks that streams over capacity drop similar shares). The agent's supervisor runs its
pipelines the same way, one thread per `PipelineHandle` around one pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge_agent.errors import EdgeAgentError
from edge_agent.paths import Layout
from edge_agent.pipelines.base import Sink
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import PipelineSpec
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats

SinksFor = Callable[[PipelineSpec], Sequence[Sink]]
"""The extra sinks (besides the spec's) one pipeline of the group gets."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one pipeline of the group ended."""

    stats: PipelineStats
    error: EdgeAgentError | None
    """What ended it early (its source failed, the engine refused a frame); None if it
    ran to its end or was stopped."""


class PipelineGroup:
    """Pipelines built from `specs` on one pool, run until each ends or `stop()`.

    Args:
        specs: The pipelines; their ids must differ.
        pool: Where compiled models come from (shared between pipelines on one model).
        sinks_for: Extra sinks per pipeline (the CLI's stdout, a test's callback).
        layout: Where capture sinks keep frames.

    Raises:
        EdgeAgentError: two specs share an id, or a pipeline cannot be built (the ones
            built before it are closed again).
    """

    def __init__(
        self,
        specs: Sequence[PipelineSpec],
        pool: ModelPool,
        sinks_for: SinksFor | None = None,
        *,
        layout: Layout | None = None,
    ) -> None:
        ids = [s.id for s in specs]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise EdgeAgentError(
                f"pipeline id {', '.join(twice)} is used by more than one spec",
                "give each spec its own `id`",
                code="config.invalid",
            )
        self.pool = pool
        self.handles: list[PipelineHandle] = []
        try:
            for spec in specs:
                extra = list(sinks_for(spec)) if sinks_for is not None else []
                self.handles.append(PipelineHandle(spec, pool, extra, layout=layout))
        except BaseException:
            self.close()
            raise

    def run(self) -> list[Outcome]:
        """Run every pipeline on its own thread until all have ended; in spec order.

        Raises:
            Whatever a pipeline's `run` raised (a bug), once all have ended.
        """
        stats: dict[int, PipelineStats] = {}
        crashed: list[BaseException] = []

        def work(i: int, handle: PipelineHandle) -> None:
            try:
                stats[i] = handle.run()
            except BaseException as exc:
                crashed.append(exc)
                self.stop()  # a bug: do not leave the others running unwatched

        threads = [
            threading.Thread(target=work, args=(i, h), name=f"pipeline-{h.spec.id}", daemon=True)
            for i, h in enumerate(self.handles)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if crashed:
            raise crashed[0]
        return [Outcome(stats[i], h.pipeline.error) for i, h in enumerate(self.handles)]

    def stop(self) -> None:
        """Ask every pipeline to stop (each ends within 2 s); safe from a signal handler."""
        for handle in self.handles:
            handle.stop()

    def snapshot(self) -> list[PipelineStats]:
        """Every pipeline's figures so far, for a live display."""
        return [h.telemetry.snapshot() for h in self.handles]

    def close(self) -> None:
        """Close every pipeline's sinks and give its models back; safe to call twice."""
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.close()
