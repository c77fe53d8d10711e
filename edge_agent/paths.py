"""The one owner of where edge-agent keeps things on disk.

Two roots, with different promises:
- the **cache** is rebuildable: fetched wheels, prepared IR, compiled blobs.
  Deleting it costs time, never data. systemd's `CacheDirectory=`.
- the **state** must survive restarts and upgrades: captures, calibrated
  models, the model store, the outbox, learned region grids, the agent's own
  records. systemd's `StateDirectory=`.

Every path below either root is built here and nowhere else, so a layout change
is one diff. Pure: no I/O and no environment reads at import; callers pass the
environment they want resolved (`os.environ` in the CLI and the service).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MODEL_NAME = r"^[a-z0-9][a-z0-9-]*$"
"""What a model's name may be: its manifest's, its release's and its store folder's."""
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def _first_of(value: str) -> str:
    # systemd joins several directories with ':'; the first is the unit's own.
    return value.split(":", 1)[0]


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """$EDGE_AGENT_CACHE, then systemd's $CACHE_DIRECTORY, then the XDG cache folder."""
    if env.get("EDGE_AGENT_CACHE"):
        return Path(env["EDGE_AGENT_CACHE"])
    if env.get("CACHE_DIRECTORY"):
        return Path(_first_of(env["CACHE_DIRECTORY"]))
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else _home(env) / ".cache") / "edge-agent"


SERVICE_DIRS = {
    "STATE_DIRECTORY": "/var/lib/edge-agent",
    "CACHE_DIRECTORY": "/var/cache/edge-agent",
}
"""What systemd/edge-agent.service's StateDirectory= and CacheDirectory= (edge-agent) give the
agent: `doctor --config`, run from an operator's shell, checks the folders the service
uses, not the caller's own (root's ~/.cache, say)."""


def default_state_dir(env: Mapping[str, str]) -> Path:
    """$EDGE_AGENT_STATE_DIR, then systemd's $STATE_DIRECTORY, then the XDG state folder."""
    if env.get("EDGE_AGENT_STATE_DIR"):
        return Path(env["EDGE_AGENT_STATE_DIR"])
    if env.get("STATE_DIRECTORY"):
        return Path(_first_of(env["STATE_DIRECTORY"]))
    xdg = env.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else _home(env) / ".local" / "state") / "edge-agent"


def default_fleet_repo(env: Mapping[str, str]) -> Path:
    """edge-fleet's published releases: $EDGE_FLEET_REPO, then the XDG data folder."""
    if env.get("EDGE_FLEET_REPO"):
        return Path(env["EDGE_FLEET_REPO"])
    xdg = env.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else _home(env) / ".local" / "share") / "edge-fleet"


def is_safe_name(name: str) -> bool:
    """True for a name that can be one path component: no separators, no dots-only, no `..`."""
    # fullmatch: `$` lets a trailing newline through ("orient\n" named a folder).
    return bool(_SAFE_NAME.fullmatch(name)) and ".." not in name


@dataclass(frozen=True, slots=True)
class Layout:
    """Every folder and file edge-agent uses, below a cache root and a state root."""

    cache: Path
    state: Path

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], cache: Path | None = None, state: Path | None = None
    ) -> Layout:
        """Explicit folders win; otherwise the environment decides (see the defaults above)."""
        return cls(
            cache=cache if cache is not None else default_cache_dir(env),
            state=state if state is not None else default_state_dir(env),
        )

    # --- cache: rebuildable -------------------------------------------------------------
    @property
    def fetched(self) -> Path:
        """Reference models fetched from their pinned wheels."""
        return self.cache / "models"

    @property
    def prepared_ir(self) -> Path:
        """IR with shape and preprocessing applied, keyed by file digest and spec."""
        return self.cache / "ir"

    @property
    def compiled(self) -> Path:
        """OpenVINO's CACHE_DIR: compiled blobs."""
        return self.cache / "compiled"

    @property
    def cache_tmp(self) -> Path:
        """Scratch space on the cache's file system (conversions, downloads)."""
        return self.cache / "tmp"

    # --- state: must survive --------------------------------------------------------------
    @property
    def all_captures(self) -> Path:
        """Every pipeline's capture reservoir (`captures`)."""
        return self.state / "captures"

    def captures(self, pipeline: str) -> Path:
        """A pipeline's capture reservoir, the data calibration runs on."""
        return self.all_captures / pipeline

    @property
    def calibrated(self) -> Path:
        """Default home of calibrated models written on this box."""
        return self.state / "calibrated"

    @property
    def store(self) -> Path:
        """The model store: blobs, releases, current/previous pointers."""
        return self.state / "store"

    @property
    def transfers(self) -> Path:
        """Partial model pulls: data files and chunk bitmaps, resumable."""
        return self.state / "transfers"

    @property
    def outbox(self) -> Path:
        """The agent's durable publish queue (sqlite)."""
        return self.state / "outbox.sqlite"

    @property
    def agent(self) -> Path:
        """The agent's own records: command answers, running pipelines, seq counters."""
        return self.state / "agent"

    @property
    def agent_lock(self) -> Path:
        """Held by the agent serving this state folder (`agent.instance`)."""
        return self.agent / "agent.lock"

    @property
    def all_regions(self) -> Path:
        """Every camera's learned grid (`regions`)."""
        return self.state / "regions"

    def regions(self, pipeline: str) -> Path:
        """A camera's learned object-size grid for the regions detection mode."""
        return self.all_regions / f"{pipeline}.json"

    @property
    def state_tmp(self) -> Path:
        """Scratch space on the state's file system, so a finished file renames into place."""
        return self.state / "tmp"

    # --- both -------------------------------------------------------------------------------
    def owned(self) -> tuple[Path, ...]:
        """Every file and folder above: the whole cache, and each part of the state.

        No pipeline may name a path inside one (`pipelines.confine`). The state folder
        itself is not one: under systemd's sandbox it is the one place a pipeline's sinks
        can write, and it holds nothing of edge-agent's but these parts.
        """
        outbox = self.outbox
        # sqlite keeps the outbox's log and index beside it while it is open.
        beside = (outbox.with_name(outbox.name + end) for end in ("-wal", "-shm", "-journal"))
        return (
            self.cache,
            self.all_captures,
            self.calibrated,
            self.store,
            self.transfers,
            outbox,
            *beside,
            self.agent,
            self.all_regions,
            self.state_tmp,
        )
