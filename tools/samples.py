"""Write the sample inputs the demo and the docs use: scikit-image's photos, as files.

Run: python tools/samples.py --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np
import skimage.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("astronaut", "coffee", "chelsea"):
        rgb = np.asarray(getattr(skimage.data, name)(), dtype=np.uint8)
        cv2.imwrite(str(out / f"{name}.png"), np.ascontiguousarray(rgb[:, :, ::-1]))
    cv2.imwrite(str(out / "page.png"), np.asarray(skimage.data.page(), dtype=np.uint8))  # type: ignore[no-untyped-call]
    print(f"samples in {out}")


if __name__ == "__main__":
    main()
