"""Write the sample inputs the demo and the docs use: scikit-image's photos, as files.

Run: python tools/samples.py --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2

from edge_agent.clips import bgr, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("astronaut", "coffee", "chelsea"):
        cv2.imwrite(str(out / f"{name}.png"), bgr(sample(name)))
    cv2.imwrite(str(out / "page.png"), sample("page"))
    print(f"samples in {out}")


if __name__ == "__main__":
    main()
