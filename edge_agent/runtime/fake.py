"""A stand-in `openvino.Core` that adds devices this machine lacks.

Only for testing device selection and fallback: a fake GPU or NPU either
fails to compile with a given driver message, or runs on the real CPU while
reporting itself, so the code above it sees both outcomes.
"""

from __future__ import annotations

from typing import Any

import openvino as ov


class FakeCore:
    """Wraps a real Core; `broken` maps fake device names to the error they raise."""

    def __init__(self, working: tuple[str, ...] = (), broken: dict[str, str] | None = None):
        self._core = ov.Core()
        self._working = working
        self._broken = broken or {}

    @property
    def available_devices(self) -> list[str]:
        return [*self._core.available_devices, *self._working, *self._broken]

    def read_model(self, model: str) -> ov.Model:
        return self._core.read_model(model)

    def compile_model(self, model: str | ov.Model, device_name: str, config: dict[str, Any]) -> Any:
        if device_name in self._broken:
            raise RuntimeError(self._broken[device_name])
        if device_name in self._working:
            return _Relabelled(self._core.compile_model(model, "CPU", config), device_name)
        return self._core.compile_model(model, device_name, config)

    def get_property(self, device_name: str, name: str) -> Any:
        if device_name in self._working or device_name in self._broken:
            return {"FULL_DEVICE_NAME": f"Fake {device_name}"}.get(name, "")
        return self._core.get_property(device_name, name)


class _Relabelled:
    """A CPU-compiled model that reports a fake device as where it executes."""

    def __init__(self, compiled: Any, device: str) -> None:
        self._compiled = compiled
        self._device = device

    def get_property(self, name: str) -> Any:
        if name == "EXECUTION_DEVICES":
            return [self._device]
        return self._compiled.get_property(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)
