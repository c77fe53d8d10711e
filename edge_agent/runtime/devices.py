"""Device requests: parse, validate, and order the candidates to try.

Pure: the engine's own list of present devices comes in as an argument, so
selection and fallback can be tested without the hardware.
"""

from __future__ import annotations

import re

from edge_agent.errors import EdgeAgentError

_PLAIN = re.compile(r"^(CPU|GPU(\.\d+)?|NPU(\.\d+)?)$")
# OpenVINO's virtual devices schedule among others themselves; pass them through whole.
_VIRTUAL = re.compile(r"^(AUTO|MULTI|HETERO)(:[A-Z0-9.,]+)?$")
_HELP = "use CPU, GPU, NPU, AUTO, or a priority list such as GPU,CPU"


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
        return [text, "CPU"]
    names = [part.strip() for part in re.split(r"[,>]", text)]
    if not names or any(not n for n in names):
        raise EdgeAgentError(f"empty device name in {request!r}", _HELP)
    for name in names:
        if not (_PLAIN.match(name) or _VIRTUAL.match(name)):
            raise EdgeAgentError(f"unknown device {name!r}", _HELP)
    if "CPU" not in names:
        names.append("CPU")
    return list(dict.fromkeys(names))


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
