"""Tiny ONNX files written byte by byte (the `onnx` package is not a dependency).

An ONNX model is a protobuf: these few fields make an Identity graph ONNX Runtime and
OpenVINO both load, with the input's name, element type, shape and opset chosen.
"""

from __future__ import annotations

from edge_agent.catalog.manifest import Manifest

FLOAT = 1
UINT8 = 2
FLOAT16 = 10


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint((number << 3) | 2) + _varint(len(data)) + data


def _value_info(name: str, dims: tuple[int, ...], elem: int) -> bytes:
    shape = b"".join(_bytes(1, _int(1, d)) for d in dims)  # TensorShapeProto.dim.dim_value
    tensor = _int(1, elem) + _bytes(2, shape)  # TypeProto.Tensor: elem_type, shape
    return _bytes(1, name) + _bytes(2, _bytes(1, tensor))


def onnx_model(
    dims: tuple[int, ...] = (1, 3, 32, 48),
    elem: int = FLOAT,
    *,
    name: str = "x",
    op: str = "Identity",
    opset: int = 13,
) -> bytes:
    """An ONNX model of one node `op` from input `name` to output "y", at `opset`."""
    node = _bytes(1, name) + _bytes(2, "y") + _bytes(3, "n") + _bytes(4, op)
    graph = (
        _bytes(1, node)
        + _bytes(2, "g")
        + _bytes(11, _value_info(name, dims, elem))
        + _bytes(12, _value_info("y", dims, elem))
    )
    opset_import = _bytes(1, "") + _int(2, opset)
    return _int(1, 8) + _bytes(7, graph) + _bytes(8, opset_import)  # ir_version 8


def image_manifest(**input_fields: object) -> Manifest:
    """A classification manifest for an `onnx_model`: a 32x48 NCHW float image input "x"
    (override any [input] field), output "y"."""
    fields: dict[str, object] = {
        "kind": "image",
        "name": "x",
        "shape": (1, 3, 32, 48),
        "layout": "NCHW",
        "element_type": "f32",
        "color": "BGR",
        **input_fields,
    }
    return Manifest.model_validate(
        {
            "name": "tiny",
            "description": "a hand-built test model",
            "task": "classification",
            "licence": "MIT",
            "format": "onnx",
            "input": fields,
            "head": {"type": "classification", "output": "y", "labels": ["a", "b", "c"]},
        }
    )
