"""Which build of edge-agent is running, when every build says version 0.1.0.

The version in pyproject.toml has not moved since the first wheel, so two wheels of different
commits both say 0.1.0: the version alone could not show whether an upgrade, or a rollback to
another build, took. The build id is a digest of the package's own Python sources as they
are on disk, so it names the code that runs: the same commit gives the same id from a wheel
or a checkout, and any changed source file gives another.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from edge_agent import __version__

_PACKAGE = Path(__file__).resolve().parent


def source_digest(package: Path) -> str:
    """12 hex digits of sha256 over each `*.py` file under `package`: its path and contents.

    Only sources count: `__pycache__` and the data files a wheel adds (`_data/`) differ
    between a wheel and a checkout of one commit, and would give them different ids.
    """
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


@cache
def build_id() -> str:
    """This process's build: `source_digest` of the imported package, read once (about 5 ms).

    Read at the first call, so a long-running process asks early (the agent, as it starts):
    a package replaced under it later is not the code it runs.
    """
    return source_digest(_PACKAGE)


def version_line() -> str:
    """The version and the build, as `--version` and doctor say them: `0.1.0 (build 1a2b...)`."""
    return f"{__version__} (build {build_id()})"
