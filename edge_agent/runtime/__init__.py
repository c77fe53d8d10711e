"""Inference backends behind one interface; `create_backend` picks one by name."""

from __future__ import annotations

from collections.abc import Callable

from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.base import Backend

BACKENDS = ("openvino", "onnxruntime")


def load_engine(name: str) -> Callable[[], Backend]:
    """The backend called `name`, ready to create; its engine is imported now, and only
    this one (a box whose OpenVINO will not load can still run ONNX Runtime).

    Raises:
        EdgeAgentError: `input.invalid`, no backend has that name; `install.incomplete`,
            its engine does not import (a missing or broken wheel, a library it cannot
            find).
    """
    try:
        if name == "openvino":
            from edge_agent.runtime.openvino_backend import OpenVinoBackend

            return OpenVinoBackend
        if name == "onnxruntime":
            from edge_agent.runtime.onnxruntime_backend import OnnxRuntimeBackend

            return OnnxRuntimeBackend
    except ImportError as exc:
        if _stopped(exc):
            raise  # a Ctrl-C or a stop that a native import disguised: the CLI says so
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        other = next(b for b in BACKENDS if b != name)
        raise EdgeAgentError(
            f"the {name} engine cannot be loaded: {lines[0] if lines else type(exc).__name__}",
            f"reinstall it (pip install --force-reinstall {name}; `edge-agent doctor` "
            f"checks it) or use the {other} backend",
            code="install.incomplete",
        ) from None
    raise EdgeAgentError(
        f"unknown backend {name!r}", "use openvino or onnxruntime", code="input.invalid"
    )


def create_backend(name: str) -> Backend:
    """Return the backend called `name`; its engine is imported only when asked for.

    Raises:
        EdgeAgentError: as `load_engine`.
    """
    return load_engine(name)()


def _stopped(exc: BaseException) -> bool:
    """Whether a signal (KeyboardInterrupt, or cli.stopping's SystemExit) is behind `exc`:
    pybind11 turns one raised during a module's initialisation into an ImportError."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if not isinstance(link, Exception):
            return True
        link = link.__cause__ or link.__context__
    return False
