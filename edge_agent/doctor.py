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

from edge_agent.build_id import version_line
from edge_agent.paths import Layout

_DEVICE_PROPERTIES = ("FULL_DEVICE_NAME", "OPTIMIZATION_CAPABILITIES", "DEVICE_ARCHITECTURE")

LOW_FREE_BYTES = 64 * 2**20
"""A folder's disk with less free than this is a problem: a model, a capture or the
outbox's next pages no longer fit."""
LOW_FREE_FRACTION = 0.05
"""Nor less than this share of the disk: on a large disk 64 MiB is already the end."""
_PROBE = bytes(4096)  # one block on the usual file systems


class DeviceFacts(BaseModel):
    """One OpenVINO device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Device id as OpenVINO lists it.")
    full_name: str = Field(description="Vendor's name for it.")
    capabilities: list[str] = Field(description="OPTIMIZATION_CAPABILITIES, e.g. FP32, BF16, INT8.")


class DoctorReport(BaseModel):
    """Everything `edge-agent doctor` checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edge_agent: str = Field(description="edge-agent version and build, e.g. '0.1.0 (build …)'.")
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
    cache_free_bytes: int | None = Field(
        default=None,
        description="Bytes free to the agent's user on the cache folder's disk; None if unknown.",
    )
    cached_models: list[str] = Field(description="Fetched model files.")
    state_dir: str = Field(description="State folder (files that must survive).")
    state_writable: bool = Field(
        description="A file can be written and synced to disk in the state folder."
    )
    state_free_bytes: int | None = Field(
        default=None,
        description="Bytes free to the agent's user on the state folder's disk; None if unknown.",
    )

    @property
    def usable(self) -> bool:
        return bool(self.devices) or bool(self.onnxruntime)


def _existing(path: Path) -> Path:
    """`path`, or its nearest existing ancestor (where it would be created)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def probe_writable(path: Path) -> str | None:
    """Why a file cannot be written in `path`; None when it can.

    Tries, rather than asking `os.access`, which says yes to root on a read-only
    mount; and writes a block and syncs it, as creating an empty folder succeeds on a
    full disk (it needs no data block) and said a full state disk was fine. Leaves
    nothing behind: a folder that does not exist yet is probed at its nearest existing
    ancestor, where it would be created.
    """
    target = _existing(path)
    if not target.is_dir():
        return f"{target} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".edge-agent-probe-", dir=target)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(_PROBE)
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        Path(probe).unlink(missing_ok=True)
    return None


def free_space(path: Path) -> tuple[int, int] | None:
    """(bytes free to an unprivileged user, bytes in all) on `path`'s disk; None if unknown.

    Free to an unprivileged user (`f_bavail`): the 5 % ext4 keeps for root is no use to
    the agent's own user, and a probe run as root would still write into it.
    """
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def low_space(free: int, total: int, floor: int = LOW_FREE_BYTES) -> bool:
    """Whether `free` of `total` bytes is too little to go on: under `floor`, or under
    `LOW_FREE_FRACTION` of the disk."""
    return free < floor or (total > 0 and free < LOW_FREE_FRACTION * total)


def collect(
    layout: Layout, core: Any | None = None, low_free_bytes: int = LOW_FREE_BYTES
) -> DoctorReport:
    """Look at the engines, devices and folders. Never raises on a broken engine: reports it.

    Args:
        layout: The cache and state folders.
        core: An OpenVINO Core to ask; a new one by default.
        low_free_bytes: Free bytes under which a folder's disk is a problem.
    """
    problems: list[str] = []
    writable: dict[str, bool] = {}
    free: dict[str, int | None] = {}
    for name, folder in (("cache", layout.cache), ("state", layout.state)):
        why = probe_writable(folder)
        writable[name] = why is None
        if why is not None:
            problems.append(f"{name} folder {folder} is not writable: {why}")
        space = free_space(folder)
        free[name] = space[0] if space is not None else None
        if space is not None and low_space(*space, floor=low_free_bytes):
            left, total = space
            share = f" ({100 * left / total:.1f} % of its disk)" if total else ""
            problems.append(
                f"{name} folder {folder} has {left / 2**20:.0f} MiB free{share}, under "
                f"{low_free_bytes / 2**20:.0f} MiB or {100 * LOW_FREE_FRACTION:.0f} %: "
                "free space on its disk before writes fail"
            )
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
        edge_agent=version_line(),
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
        cache_free_bytes=free["cache"],
        cached_models=sorted(str(p.relative_to(layout.fetched)) for p in files),
        state_dir=str(layout.state),
        state_writable=writable["state"],
        state_free_bytes=free["state"],
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
