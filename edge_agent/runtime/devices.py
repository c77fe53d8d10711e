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
    rather than stop. Virtual devices (AUTO:..., MULTI:..., HETERO:...) are one
    candidate; OpenVINO does their selection and we report what it chose.

    Raises:
        EdgeAgentError: an empty or unknown device name.
    """
    text = request.strip().upper()
    if _VIRTUAL.match(text):
        return [text, "CPU"] if text != "CPU" else [text]
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
        return candidate in available
    # "GPU" means any GPU: OpenVINO lists them as GPU, or GPU.0 and GPU.1 on multi-GPU boxes.
    return any(d == candidate or d.startswith(candidate + ".") for d in available)
