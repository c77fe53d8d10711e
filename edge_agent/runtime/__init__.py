"""Inference backends behind one interface; `create_backend` picks one by name."""

from __future__ import annotations

from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.base import Backend


def create_backend(name: str) -> Backend:
    """Return the backend called `name`; its engine is imported only when asked for."""
    if name == "openvino":
        from edge_agent.runtime.openvino_backend import OpenVinoBackend

        return OpenVinoBackend()
    if name == "onnxruntime":
        from edge_agent.runtime.onnxruntime_backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend()
    raise EdgeAgentError(
        f"unknown backend {name!r}", "use openvino or onnxruntime", code="input.invalid"
    )
