"""Model delivery on the wire: control messages (JSON) and chunk frames (binary).

The design follows AWS IoT's MQTT file delivery (GetStream names a block size,
an offset, a count and a bitmap of the blocks wanted, and each answer carries
one block of at most 128 KB), with one change that issue 9's measurements ask
for: the blocks every device needs travel once, as a paced broadcast on one
topic per release, and only the blocks a device missed are asked for one by one.
docs/PROTOCOL.md shows the sequence and the failure cases.

Chunk frames are binary, not JSON+base64: base64 would add a third to every
byte the broker sends, and the benchmark allows 10% overhead in all.
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
_RELEASE_ID = r"^[0-9a-f]{16}$"
MAX_REPAIR_BLOCKS = 64
"""Blocks one repair request may ask for; each comes back as its own message."""
MAX_REPAIR_BYTES = 2 * 1024 * 1024
"""Bytes of chunks one repair request is answered with at most (16 chunks of 128 KiB): a
server answers the first chunks asked for that fit, and a puller asks no more."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- device -> fleet: <prefix>/<device>/delivery/ctl/<name>/<version> -------------------
class Join(_Strict):
    """A device starts (or resumes) pulling a release and wants the broadcast."""

    kind: Literal["join"] = Field(default="join", description="Message selector.")
    device_id: str = Field(pattern=_ID, description="The pulling device.")
    release_id: str = Field(pattern=_RELEASE_ID, description="`release_id` of the release.")
    chunks: int = Field(ge=0, description="Chunks in the release (all files, in order).")
    missing: str = Field(
        description="Base64 bitmap over the release's chunks, bit i (LSB first) set when chunk "
        "i is still missing on the device: what a resumed pull does not need again."
    )


class Ack(_Strict):
    """How far the broadcast has reached a device: paces the broadcaster to its pullers."""

    kind: Literal["ack"] = Field(default="ack", description="Message selector.")
    device_id: str = Field(pattern=_ID, description="The pulling device.")
    seq: int = Field(ge=0, description="Highest broadcast frame sequence number received.")


class Leave(_Strict):
    """A device no longer wants the broadcast."""

    kind: Literal["leave"] = Field(default="leave", description="Message selector.")
    device_id: str = Field(pattern=_ID, description="The device.")
    reason: Literal["complete", "cancelled", "repairing"] = Field(description="Why it leaves.")


Control = Annotated[Join | Ack | Leave, Field(discriminator="kind")]
CONTROL: TypeAdapter[Join | Ack | Leave] = TypeAdapter(Control)


# --- fleet -> devices: <prefix>/delivery/<name>/<version>/status -----------------------------
BroadcastState = Literal["gathering", "sending", "idle"]


class BroadcastStatus(_Strict):
    """What the broadcaster of one release is doing; published when it changes."""

    release_id: str = Field(pattern=_RELEASE_ID, description="The release.")
    broadcaster: str = Field(description="Fleet server instance sending the broadcast.")
    state: BroadcastState = Field(
        description="gathering: waiting briefly for more joins; sending; idle: nobody needs more."
    )
    seq: int = Field(ge=0, description="Sequence number the next frame will carry.")
    done: list[str] = Field(
        default_factory=list,
        description="Devices whose broadcast pass is complete since the last status: each "
        "has been sent every chunk it asked for, has not left complete within the grace "
        "(1 s), and repairs what it still misses.",
    )


# --- device -> fleet: <prefix>/<device>/delivery/repair (shared by fleet servers) ------------
class RepairRequest(_Strict):
    """AWS GetStream's shape: the blocks `offset .. offset+count-1` whose bit is set."""

    device_id: str = Field(pattern=_ID, description="The device asking.")
    name: str = Field(description="Release name.")
    version: int = Field(ge=1, description="Release version.")
    release_id: str = Field(pattern=_RELEASE_ID, description="`release_id` of the release.")
    block_size: int = Field(description="Chunk size; must equal the release's chunk_size.")
    offset: int = Field(ge=0, description="First chunk index this request covers.")
    count: int = Field(ge=1, le=MAX_REPAIR_BLOCKS, description="Chunks covered.")
    bitmap: str = Field(description="Base64 bitmap of `count` bits, LSB first: 1 = send it.")
    response_topic: str | None = Field(
        default=None,
        description="MQTT 3.1.1 only: where to answer (MQTT 5 uses the Response Topic).",
    )
    correlation_data: str | None = Field(
        default=None,
        description="MQTT 3.1.1 only: base64 correlation data (MQTT 5 uses the property).",
    )


class RepairError(_Strict):
    """The fleet cannot serve a repair; sent on the response topic instead of frames."""

    kind: Literal["error"] = Field(default="error", description="Message selector.")
    release_id: str = Field(description="The release asked for.")
    correlation_data: str | None = Field(
        default=None, description="Base64 correlation data of the request (also on 3.1.1)."
    )
    code: str = Field(description="Error code: release.invalid, store.not_found, input.invalid.")
    message: str = Field(description="What is wrong.")


# --- fleet server presence: <prefix>/fleet/servers/<instance> (retained) --------------------
class ServerPresence(_Strict):
    """A fleet server announces itself; its will (an empty retained message) removes it.

    Servers pick each release's one broadcaster by rendezvous hashing over the
    servers present, so no instance is special and a dead one's releases move.
    """

    instance: str = Field(description="Server instance id.")
    started_at: float = Field(description="Unix seconds when it started.")


def all_delivery_messages() -> dict[str, type[BaseModel]]:
    """Every delivery message by name, for schema export."""
    return {
        "delivery.Join": Join,
        "delivery.Ack": Ack,
        "delivery.Leave": Leave,
        "delivery.BroadcastStatus": BroadcastStatus,
        "delivery.RepairRequest": RepairRequest,
        "delivery.RepairError": RepairError,
        "delivery.ServerPresence": ServerPresence,
    }


# --- chunk frames -------------------------------------------------------------------------
FRAME_MAGIC = b"EAD1"
_FRAME = struct.Struct("!4sBxHIII8s")
FRAME_HEADER_BYTES = _FRAME.size
FLAG_REPAIR = 1


@dataclass(frozen=True, slots=True)
class Frame:
    """One chunk on the wire: a 28-byte header, then the chunk's bytes.

    Header (network byte order): magic "EAD1"; flags u8 (1 = repair answer);
    pad u8; reserved u16; seq u32 (broadcast sequence, 0 in a repair); index u32
    (chunk index over all the release's files, in order); length u32; release id
    (8 bytes, the first 16 hex digits of `release_id` as bytes).
    """

    release_id: str
    index: int
    data: bytes
    seq: int = 0
    repair: bool = False

    def encode(self) -> bytes:
        header = _FRAME.pack(
            FRAME_MAGIC,
            FLAG_REPAIR if self.repair else 0,
            0,
            self.seq,
            self.index,
            len(self.data),
            bytes.fromhex(self.release_id),
        )
        return header + self.data


def decode_frame(payload: bytes) -> Frame | None:
    """The frame in `payload`, or None if it is not a well-formed frame."""
    if len(payload) < FRAME_HEADER_BYTES or payload[:4] != FRAME_MAGIC:
        return None
    _, flags, _, seq, index, length, rid = _FRAME.unpack_from(payload)
    data = payload[FRAME_HEADER_BYTES:]
    if len(data) != length:
        return None
    return Frame(rid.hex(), index, data, seq, bool(flags & FLAG_REPAIR))


# --- bitmaps ------------------------------------------------------------------------------
def encode_bits(bits: bytes | bytearray) -> str:
    return base64.b64encode(bytes(bits)).decode("ascii")


def decode_base64(text: str) -> bytes | None:
    """`text` as base64 (a bitmap, correlation data); None if it is not."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def decode_bits(text: str, count: int) -> bytearray | None:
    """A bitmap of at least `count` bits from base64; None if malformed or short."""
    raw = decode_base64(text)
    return bytearray(raw) if raw is not None and len(raw) * 8 >= count else None


def bit(bits: bytes | bytearray, i: int) -> bool:
    return bool(bits[i >> 3] & (1 << (i & 7)))


def set_bit(bits: bytearray, i: int, on: bool = True) -> None:
    if on:
        bits[i >> 3] |= 1 << (i & 7)
    else:
        bits[i >> 3] &= ~(1 << (i & 7)) & 0xFF


def bitmap(count: int, indices: list[int] | range) -> bytearray:
    bits = bytearray((count + 7) // 8)
    for i in indices:
        set_bit(bits, i)
    return bits
