"""The manifest's image input checked against the model file, alike on every engine.

Each engine reads the file's inputs its own way; this says, in one wording, where the
manifest's `[input]` does not fit them. Without it the two engines failed apart: ONNX
Runtime compiled a wrong input name and failed on the first frame as inference.failed,
and OpenVINO ran a float model declared `element_type = "u8"` on raw 0-255 frames,
mean and scale skipped, with wrong results and no error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from edge_agent.catalog.manifest import ImageInput
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_event

log = logging.getLogger(__name__)


def check_image_input(model: str, spec: ImageInput, inputs: Mapping[str, tuple[str, int]]) -> None:
    """Refuse a manifest whose image input is not one of the model's, or has another element
    type or rank; warn of a mean or scale given with a uint8 input, which no engine applies.

    Args:
        model: the model's name, for the message.
        spec: the manifest's image input.
        inputs: each of the model's input names to its element type ("f32", "u8", or the
            engine's own name for any other) and its rank (-1 when the file leaves it free).

    Raises:
        EdgeAgentError: `model.shape`, saying what to set in the manifest.
    """
    found = inputs.get(spec.name)
    if found is None:
        names = ", ".join(sorted(inputs)) or "none"
        raise EdgeAgentError(
            f"{model}'s manifest [input] name {spec.name!r} is not an input of the model "
            f"(its inputs: {names})",
            "set [input] name in the model's manifest to its image input",
            code="model.shape",
        )
    element_type, rank = found
    if element_type != spec.element_type:
        fix = (
            f'set [input] element_type = "{element_type}" in the model\'s manifest'
            if element_type in ("f32", "u8")
            else "re-export the model with a float32 or uint8 image input"
        )
        raise EdgeAgentError(
            f"{model}'s manifest [input] says element_type {spec.element_type}, but the "
            f"model's input {spec.name} takes {element_type}",
            fix,
            code="model.shape",
        )
    if rank not in (-1, len(spec.shape)):
        raise EdgeAgentError(
            f"{model}'s manifest [input] shape has {len(spec.shape)} dims, but the model's "
            f"input {spec.name} has {rank}",
            "set [input] shape and layout in the model's manifest to its own",
            code="model.shape",
        )
    if spec.element_type == "u8" and (
        any(m != 0.0 for m in spec.mean) or any(v != 1.0 for v in spec.scale)
    ):
        # A warning, not a refusal: a manifest is signed into every release the store
        # holds, and one refused at parse made a release that served, raw 0-255 pixels
        # being what its model takes, unreadable after an upgrade.
        log_event(
            log,
            logging.WARNING,
            "manifest_normalisation_ignored",
            model=model,
            detail="a u8 input is fed raw 0-255 pixels: the manifest's mean and scale are "
            'not applied; drop them, or set element_type = "f32" if the model takes floats',
        )
