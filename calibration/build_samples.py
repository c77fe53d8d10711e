"""Build sample calibration sets for the reference models, from data that ships in wheels.

Images come from scikit-image's sample photos (varied crops and scales, and a
scene with the astronaut walking through it); speech comes from espeak-ng with
silence between phrases. A real deployment calibrates on its own camera's
frames instead (`--data pipeline:<id>`); these sets exist so the recipes can be
exercised anywhere.

Run: python calibration/build_samples.py --out DIR
Makes DIR/images (person-ssdlite, face-blazeface, text-orientation),
DIR/text (text-det-ppocr) and DIR/speech (vad-silero).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import skimage.data

PHRASES = [
    "the truck is at the loading dock",
    "please close the north gate",
    "motion detected near the fence",
    "all clear on camera two",
    "shift change at six in the morning",
    "delivery for bay number four",
]


def _photo(name: str) -> npt.NDArray[np.uint8]:
    image = np.asarray(getattr(skimage.data, name)(), dtype=np.uint8)
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, ::-1])


def images(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    scene = cv2.resize(_photo("coffee"), (640, 480))
    person = cv2.resize(_photo("astronaut"), (480, 480))
    for x in range(-160, 320, 40):
        frame = scene.copy()
        left, right = max(x, 0), min(x + 480, 640)
        frame[:, left:right] = person[:, left - x : right - x]
        cv2.imwrite(str(out / f"scene-{count:03d}.jpg"), frame)
        count += 1
    for name in ("astronaut", "coffee", "chelsea", "rocket", "page", "camera"):
        photo = _photo(name)
        for scale in (1.0, 0.75):
            for turns in (0, 1, 2, 3):
                h, w = photo.shape[:2]
                crop = photo[: int(h * scale), : int(w * scale)]
                cv2.imwrite(str(out / f"{name}-{count:03d}.jpg"), np.rot90(crop, turns))
                count += 1
    return count


def text(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for name in ("page", "text"):
        photo = _photo(name)
        for scale in (1.0, 0.8, 0.6):
            for turns in (0, 2):
                resized = cv2.resize(photo, None, fx=scale, fy=scale)
                cv2.imwrite(str(out / f"{name}-{count:03d}.png"), np.rot90(resized, turns))
                count += 1
    return count


def speech(out: Path, rate: int = 16000) -> int:
    exe = shutil.which("espeak-ng")
    if exe is None:
        sys.exit("espeak-ng is missing: apt-get install espeak-ng")
    out.mkdir(parents=True, exist_ok=True)
    from edge_agent.audio.resample import resample
    from edge_agent.audio.wav import read_wav, to_mono

    gap = np.zeros(rate, dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(0, len(PHRASES), 2):
            parts = [gap]
            for phrase in PHRASES[i : i + 2]:
                wav = Path(tmp) / "p.wav"
                subprocess.run([exe, "-w", str(wav), phrase], check=True, capture_output=True)
                samples, source = read_wav(wav)
                parts += [resample(to_mono(samples), source, rate), gap]
            clip = np.concatenate(parts)
            with wave.open(str(out / f"speech-{i // 2}.wav"), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(rate)
                w.writeframes((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())
    return len(PHRASES) // 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    print(f"images: {images(out / 'images')}, text: {text(out / 'text')}, "
          f"speech: {speech(out / 'speech')} -> {out}")  # fmt: skip


if __name__ == "__main__":
    main()
