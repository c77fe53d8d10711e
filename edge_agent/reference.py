"""Where the reference manifests and calibration recipes that ship with edge-agent live.

Their source is the checkout's top-level `models/` and `calibration/`. A wheel carries
copies in `edge_agent/_data/` (setup.py's build step puts them there), found through
importlib.resources, so `pip install .` works anywhere. A source checkout, or an editable
install of one, has no copies and reads the source folders themselves.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Literal

from edge_agent.errors import EdgeAgentError

Kind = Literal["models", "calibration"]


def reference_dir(kind: Kind) -> Path:
    """The folder of reference manifests (`models`) or calibration recipes (`calibration`).

    Raises:
        EdgeAgentError: `install.incomplete`, neither the wheel's copy nor a checkout's is there.
    """
    shipped = files("edge_agent") / "_data" / kind
    # pip unpacks wheels onto the file system, so the copy is a real folder the catalog can
    # list; a zipped install has no Path and falls through to the error.
    if isinstance(shipped, Path) and shipped.is_dir():
        return shipped
    checkout = Path(__file__).resolve().parents[1] / kind
    if checkout.is_dir():
        return checkout
    raise EdgeAgentError(
        f"edge-agent's reference {kind} folder is missing from its install ({shipped})",
        "reinstall edge-agent: pip install --force-reinstall edge-agent",
        code="install.incomplete",
    )
