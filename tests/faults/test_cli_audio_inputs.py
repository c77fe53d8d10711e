"""Damaged and empty WAV files, as a user hands them to each command that reads audio.

A header with an absurd sample rate used to end in a 223 GiB allocation error, a 1 Hz
one in a hang, and empty, odd-byte or 65535-channel files in exit 0 with no output.
Each is now one `edge-agent: error: problem; fix [code]` line and exit 2, from
`infer`, `run-pipeline` and `calibrate` alike; a truncated file fails `infer` as it
fails `run-pipeline`.
"""

from __future__ import annotations

import struct
import subprocess
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.cli_kit import edge_agent_cli, one_line_error

pytestmark = pytest.mark.usefixtures("cache_dir")

# Long enough for a cold start; the old code hung on a 1 Hz file until killed.
TIMEOUT_S = 120.0


def speechlike_wav(path: Path, rate: int = 16000, frames: int = 16000) -> bytes:
    """A valid 16-bit mono WAV (a 220 Hz tone), written by stdlib `wave`; its bytes."""
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(frames) / 16000)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((tone * 32767).astype("<i2").tobytes())
    return path.read_bytes()


def absurd_rate(path: Path) -> None:
    data = bytearray(speechlike_wav(path))
    data[24:28] = struct.pack("<I", 0xFFFFFFFF)
    path.write_bytes(bytes(data))


def one_hz(path: Path) -> None:
    speechlike_wav(path, rate=1)


def many_channels(path: Path) -> None:
    data = bytearray(speechlike_wav(path))
    data[22:24] = struct.pack("<H", 65535)
    path.write_bytes(bytes(data))


def empty(path: Path) -> None:
    speechlike_wav(path, frames=0)


def one_odd_byte(path: Path) -> None:
    data = bytearray(speechlike_wav(path, frames=0))
    data[40:44] = struct.pack("<I", 1)  # the data chunk says it holds that byte
    path.write_bytes(bytes(data) + b"\x01")


DAMAGED: dict[str, tuple[Callable[[Path], None], str]] = {
    "absurd-rate": (absurd_rate, "sample rate of 4294967295 Hz, outside 1000 to 384000 Hz"),
    "one-hz": (one_hz, "sample rate of 1 Hz, outside 1000 to 384000 Hz"),
    "65535-channels": (many_channels, "65535 channels, outside 1 to 32"),
    "empty": (empty, "no audio samples"),
    "one-odd-byte": (one_odd_byte, "no audio samples"),
}


def damaged(tmp_path: Path, kind: str) -> tuple[Path, str]:
    write, needle = DAMAGED[kind]
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / f"{kind}.wav"
    write(path)
    return path, needle


def edge_agent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return edge_agent_cli("--state-dir", str(tmp_path / "state"), *args, timeout=TIMEOUT_S)


@pytest.mark.parametrize("kind", DAMAGED)
def test_infer_refuses_a_damaged_or_empty_wav(tmp_path: Path, kind: str) -> None:
    path, needle = damaged(tmp_path, kind)
    proc = edge_agent(tmp_path, "infer", "--model", "vad-silero", "--input", str(path))
    assert one_line_error(proc, str(path), needle) == "input.unreadable"
    assert proc.stdout == ""


@pytest.mark.parametrize("kind", DAMAGED)
def test_run_pipeline_refuses_a_damaged_or_empty_wav(tmp_path: Path, kind: str) -> None:
    path, needle = damaged(tmp_path, kind)
    source = ["--source", str(path), "--max-frames", "3"]
    proc = edge_agent(tmp_path, "run-pipeline", "--model", "vad-silero", *source)
    assert one_line_error(proc, str(path), needle) == "input.unreadable"


@pytest.mark.parametrize("kind", ["absurd-rate", "one-hz", "65535-channels", "empty"])
def test_calibrate_refuses_a_damaged_or_empty_wav_in_its_data(tmp_path: Path, kind: str) -> None:
    path, needle = damaged(tmp_path, kind)
    proc = edge_agent(
        tmp_path,
        "calibrate",
        "--model",
        "vad-silero",
        "--data",
        str(path.parent),
        "--out",
        str(tmp_path / "out"),
    )
    assert one_line_error(proc, str(path), needle) == "input.unreadable"
    assert not (tmp_path / "out").exists()


def test_infer_refuses_a_truncated_wav_as_run_pipeline_does(tmp_path: Path) -> None:
    path = tmp_path / "cut.wav"
    data = speechlike_wav(path)  # the header promises 1 s
    path.write_bytes(data[: 44 + int(0.31 * 16000) * 2])
    proc = edge_agent(tmp_path, "infer", "--model", "vad-silero", "--input", str(path))
    code = one_line_error(proc, str(path), "0.69 s short", "after 0.31 s", "truncated")
    assert code == "source.failed"
    assert proc.stdout == ""
    # The whole file, at either end of the rates taken, still runs.
    for rate in (1000, 384000):
        whole = tmp_path / f"whole-{rate}.wav"
        speechlike_wav(whole, rate=rate, frames=rate // 2)
        proc = edge_agent(tmp_path, "infer", "--model", "vad-silero", "--input", str(whole))
        assert proc.returncode == 0, proc.stderr


def test_run_pipeline_refuses_a_mic_device_alsa_would_hand_to_a_shell(tmp_path: Path) -> None:
    # A traceback before; and the name went to `arecord -D`, where ALSA's file PCM runs it.
    proof = tmp_path / "X"
    source = f"mic:file:'|touch {proof}'"
    proc = edge_agent(tmp_path, "run-pipeline", "--model", "vad-silero", "--source", source)
    assert one_line_error(proc, "not a plain ALSA device name", "mic:hw:1,0") == "input.invalid"
    assert not proof.exists()
