"""What this box can run: engines, devices, GPU/NPU access, and the cache and state folders.

Collected as data so the CLI prints it and, later, the agent publishes it.
"""

from __future__ import annotations

import grp
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.paths import Layout

_DEVICE_PROPERTIES = ("FULL_DEVICE_NAME", "OPTIMIZATION_CAPABILITIES", "DEVICE_ARCHITECTURE")


class DeviceFacts(BaseModel):
    """One OpenVINO device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Device id as OpenVINO lists it.")
    full_name: str = Field(description="Vendor's name for it.")
    capabilities: list[str] = Field(description="OPTIMIZATION_CAPABILITIES, e.g. FP32, BF16, INT8.")


class DoctorReport(BaseModel):
    """Everything `edge-agent doctor` checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    openvino: str | None = Field(description="OpenVINO version, None if it does not import.")
    onnxruntime: str | None = Field(description="ONNX Runtime version, None if it does not import.")
    onnxruntime_providers: list[str] = Field(description="ONNX Runtime execution providers.")
    devices: list[DeviceFacts] = Field(description="OpenVINO devices found.")
    problems: list[str] = Field(description="Things that stop a device or engine from working.")
    dri_nodes: list[str] = Field(description="/dev/dri render and card nodes.")
    render_access: bool = Field(description="This user can open a render node (iGPU inference).")
    npu_driver: bool = Field(description="/dev/accel nodes of an NPU driver exist.")
    cache_dir: str = Field(description="Model cache folder (rebuildable files).")
    cache_writable: bool = Field(description="Files can be created in the cache folder.")
    cache_bytes: int = Field(description="Bytes in the model cache.")
    cached_models: list[str] = Field(description="Fetched model files.")
    state_dir: str = Field(description="State folder (files that must survive).")
    state_writable: bool = Field(description="Files can be created in the state folder.")

    @property
    def usable(self) -> bool:
        return bool(self.devices) or bool(self.onnxruntime)


def probe_writable(path: Path) -> str | None:
    """Why files cannot be created in `path`; None when they can.

    Tries, rather than asking `os.access`, which says yes to root on a read-only
    mount. Leaves nothing behind: a folder that does not exist yet is probed at
    its nearest existing ancestor, where it would be created.
    """
    target = path
    while not target.exists() and target.parent != target:
        target = target.parent
    if not target.is_dir():
        return f"{target} is not a folder"
    try:
        probe = tempfile.mkdtemp(prefix=".edge-agent-probe-", dir=target)
    except OSError as exc:
        return exc.strerror or str(exc)
    Path(probe).rmdir()
    return None


def collect(layout: Layout, core: Any | None = None) -> DoctorReport:
    """Look at the engines, devices and folders. Never raises on a broken engine: reports it."""
    problems: list[str] = []
    writable: dict[str, bool] = {}
    for name, folder in (("cache", layout.cache), ("state", layout.state)):
        why = probe_writable(folder)
        writable[name] = why is None
        if why is not None:
            problems.append(f"{name} folder {folder} is not writable: {why}")
    cache_dir = layout.cache
    ov_version: str | None = None
    devices: list[DeviceFacts] = []
    try:
        import openvino as ov

        ov_version = ov.get_version()
        core = core if core is not None else ov.Core()
        for name in core.available_devices:
            facts = {p: _prop(core, name, p) for p in _DEVICE_PROPERTIES}
            caps = facts["OPTIMIZATION_CAPABILITIES"]
            devices.append(
                DeviceFacts(
                    name=name,
                    full_name=str(facts["FULL_DEVICE_NAME"] or name),
                    capabilities=[str(c) for c in caps] if isinstance(caps, list) else [],
                )
            )
    except Exception as exc:  # a broken install is a finding, not a crash
        problems.append(f"openvino unusable: {exc}")
    ort_version: str | None = None
    providers: list[str] = []
    try:
        import onnxruntime as ort

        ort_version = ort.__version__
        providers = list(ort.get_available_providers())
    except Exception as exc:
        problems.append(f"onnxruntime unusable: {exc}")

    dri = sorted(str(p) for p in Path("/dev/dri").glob("*")) if Path("/dev/dri").is_dir() else []
    renders = [p for p in dri if "renderD" in p]
    render_access = any(os.access(p, os.R_OK | os.W_OK) for p in renders)
    if renders and not render_access:
        problems.append(
            f"no access to {renders[0]}: add this user to the "
            f"'{_group_of(renders[0])}' group for GPU inference"
        )
    npu = Path("/dev/accel").is_dir() and any(Path("/dev/accel").iterdir())
    files = (
        [p for p in layout.fetched.rglob("*") if p.is_file() and ".fetch-" not in str(p)]
        if layout.fetched.is_dir()
        else []
    )
    total = (
        sum(p.stat().st_size for p in cache_dir.rglob("*") if p.is_file())
        if cache_dir.is_dir()
        else 0
    )
    return DoctorReport(
        openvino=ov_version,
        onnxruntime=ort_version,
        onnxruntime_providers=providers,
        devices=devices,
        problems=problems,
        dri_nodes=dri,
        render_access=render_access,
        npu_driver=npu,
        cache_dir=str(cache_dir),
        cache_writable=writable["cache"],
        cache_bytes=total,
        cached_models=sorted(str(p.relative_to(layout.fetched)) for p in files),
        state_dir=str(layout.state),
        state_writable=writable["state"],
    )


def _prop(core: Any, device: str, name: str) -> Any:
    try:
        return core.get_property(device, name)
    except Exception:  # properties vary by device and plugin version
        return None


def _group_of(path: str) -> str:
    try:
        return grp.getgrgid(Path(path).stat().st_gid).gr_name
    except (KeyError, OSError):
        return "render"
