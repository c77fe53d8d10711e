"""Device requests: parse, validate, and order the candidates to try.

Pure: the engine's own list of present devices comes in as an argument, so
selection and fallback can be tested without the hardware.
"""

from __future__ import annotations

import re

from edge_agent.errors import EdgeAgentError

_PLAIN = re.compile(r"^(CPU|GPU(\.\d+)?|NPU(\.\d+)?)$")
# OpenVINO's virtual devices schedule among others themselves; pass them through whole.
_VIRTUAL = re.compile(r"^(AUTO|MULTI|HETERO)(:.*)?$", re.DOTALL)
_HELP = "use CPU, GPU, NPU, AUTO, or a priority list such as GPU,CPU"
_VIRTUAL_HELP = "list physical devices after the colon, e.g. AUTO:GPU,CPU or HETERO:GPU,CPU"

# Driver failures as the engine words them, and what they mean to an operator.
_DRIVER_MESSAGES = (
    (
        re.compile(r"libOpenCL\.so[.\d]*: cannot open shared object", re.IGNORECASE),
        "no OpenCL runtime (libOpenCL.so.1) installed; install intel-opencl-icd",
    ),
    (
        re.compile(r"libze_loader\.so[.\d]*: cannot open shared object", re.IGNORECASE),
        "no Level Zero runtime (libze_loader.so.1) installed; install level-zero "
        "and the Intel NPU or GPU driver",
    ),
    (
        re.compile(r"intel_npu\S*\.so[.\d]*: cannot open shared object", re.IGNORECASE),
        "no NPU driver installed; install the Intel NPU driver (intel-driver-compiler-npu)",
    ),
)
_LIBRARY = re.compile(r'Cannot load library "[^"]*/([^/"]+)": (.*)', re.IGNORECASE)
_DIRS = re.compile(r"/\S*/")


def parse_request(request: str) -> list[str]:
    """Split a device request into candidates, in the order to try them.

    A single physical device, or a list, gets CPU appended as the last resort:
    a box whose GPU driver broke overnight should keep running, and say so,
    rather than stop. A virtual device (AUTO:..., MULTI:..., HETERO:...) is one
    candidate, not split up: OpenVINO does its selection and we report what it
    chose, with CPU after it in case the virtual device itself cannot start.

    Raises:
        EdgeAgentError: an empty or unknown device name.
    """
    text = request.strip().upper()
    if _VIRTUAL.match(text):
        _check_virtual(text, request)
        return [text, "CPU"]
    names = [part.strip() for part in re.split(r"[,>]", text)]
    if not names or any(not n for n in names):
        raise EdgeAgentError(f"empty device name in {request!r}", _HELP, code="device.invalid")
    for name in names:
        if not _PLAIN.match(name):
            raise EdgeAgentError(f"unknown device {name!r}", _HELP, code="device.invalid")
    if "CPU" not in names:
        names.append("CPU")
    return list(dict.fromkeys(names))


def _check_virtual(text: str, request: str) -> None:
    """Hold the devices inside AUTO:/MULTI:/HETERO: to the same names as a plain request."""
    kind, colon, inner = text.partition(":")
    if not colon:
        return  # plain AUTO, MULTI or HETERO: the engine picks among what it has
    names = [part.strip() for part in inner.split(",")]
    if any(not n for n in names):
        raise EdgeAgentError(
            f"empty device name in {request!r}", _VIRTUAL_HELP, code="device.invalid"
        )
    for name in names:
        # AUTO alone takes "-CPU" to mean "any device but the CPU".
        bare = name[1:] if kind == "AUTO" and name.startswith("-") else name
        if not _PLAIN.match(bare):
            raise EdgeAgentError(
                f"unknown device {bare!r} in {request!r}", _VIRTUAL_HELP, code="device.invalid"
            )


def explain_failure(message: str) -> str:
    """An engine's device error in our words, once: what is missing and what to install.

    Args:
        message: the engine's message, already cut to its useful line.

    Returns:
        A known driver problem as a sentence with its fix; any other library load
        failure without the engine's install paths; anything else unchanged.
    """
    for pattern, meaning in _DRIVER_MESSAGES:
        if pattern.search(message):
            return meaning
    found = _LIBRARY.search(message)
    if found:
        return f"cannot load {found.group(1)}: {_DIRS.sub('', found.group(2)).strip()}"
    return message


def is_present(candidate: str, available: list[str]) -> bool:
    """True when the engine lists the device, or the virtual device can pick from any."""
    if _VIRTUAL.match(candidate):
        return bool(available)
    if "." in candidate:
        # A one-GPU box lists plain "GPU", which OpenVINO documents as an alias of GPU.0.
        family, _, index = candidate.partition(".")
        return candidate in available or (index == "0" and family in available)
    # "GPU" means any GPU: OpenVINO lists them as GPU, or GPU.0 and GPU.1 on multi-GPU boxes.
    return any(d == candidate or d.startswith(candidate + ".") for d in available)
