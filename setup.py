"""Build step that pyproject.toml cannot say: ship the reference manifests and recipes.

`models/*.toml` and `calibration/*.toml` stay at the top of the checkout, where people edit
them; setuptools' package data only takes files inside a package, so this copies them into
the wheel as `edge_agent/_data/{models,calibration}/`, where `edge_agent.reference` finds
them through importlib.resources. An editable install reads the checkout's folders instead,
so there is nothing to copy (and no stale copy to go wrong).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
REFERENCE = ("models", "calibration")


class BuildPyWithReference(build_py):  # type: ignore[misc]  # setuptools ships no types
    """build_py, plus the reference TOML files copied under edge_agent/_data/."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for kind in REFERENCE:
            target = Path(self.build_lib) / "edge_agent" / "_data" / kind
            target.mkdir(parents=True, exist_ok=True)
            for source in sorted((ROOT / kind).glob("*.toml")):
                shutil.copyfile(source, target / source.name)


setup(cmdclass={"build_py": BuildPyWithReference})
