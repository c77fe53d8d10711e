"""Shared fixtures: the model cache, compiled reference models, real inputs.

Models are fetched once per machine into $EDGE_AGENT_CACHE (the Makefile points
it at .cache/edge-agent in the checkout) from their pinned wheels, and compiled
once per session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import wave
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, settings

from edge_agent.catalog.catalog import Catalog, ResolvedModel, default_models_dir

# Re-exported (mypy strict wants it said): many tests import their photos from here.
from edge_agent.clips import bgr as bgr
from edge_agent.clips import sample as sample
from edge_agent.comms.local_broker import free_port
from edge_agent.privacy import disable_usage_telemetry
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import CompiledModel, RuntimeOptions
from tests.integration.mjpeg_server import MjpegServer

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ["tests.broker"]

disable_usage_telemetry()

# A runner that starts the suite with SIGINT ignored (nohup, `cmd &` in a script) passes that
# on to every process the tests start, since an ignored signal stays ignored across exec, and
# the edge-agent processes the Ctrl-C tests interrupt would shrug the signal off (the CLI
# leaves an ignored SIGINT ignored, as a daemon's caller meant). A handled signal goes back
# to its default across exec, so handling it here gives every child the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hypothesis profiles. "ci": the same examples on every run and no example database, so a red
# CI is a real defect that reproduces, not a flake; print_blob gives the exact failing example
# to replay with @reproduce_failure. Timing checks are off because the CI box is shared.
# "fuzz": many fresh random examples, run by hand with `make fuzz`; whatever it finds becomes
# an explicit test. Without either, developers get Hypothesis' defaults (random, with the
# database in .hypothesis/).
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "2000")),
    derandomize=False,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "default")
)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    path = Path(os.environ.get("EDGE_AGENT_CACHE", REPO / ".cache" / "edge-agent"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def catalog(cache_dir: Path) -> Catalog:
    return Catalog(default_models_dir(), cache_dir)


@pytest.fixture(scope="session")
def resolve(catalog: Catalog) -> Callable[[str], ResolvedModel]:
    found: dict[str, ResolvedModel] = {}

    def _resolve(name: str) -> ResolvedModel:
        if name not in found:
            found[name] = catalog.resolve(name)
        return found[name]

    return _resolve


CompileFn = Callable[..., tuple[CompiledModel, ResolvedModel]]


@pytest.fixture(scope="session")
def compiled(resolve: Callable[[str], ResolvedModel], cache_dir: Path) -> CompileFn:
    """compiled(name, backend="openvino", **options) -> (model, resolved), cached per session."""
    done: dict[tuple[str, str, str], tuple[CompiledModel, ResolvedModel]] = {}

    def _compile(
        name: str, backend: str = "openvino", **options: object
    ) -> tuple[CompiledModel, ResolvedModel]:
        key = (name, backend, repr(sorted(options.items())))
        if key not in done:
            resolved = resolve(name)
            opts = RuntimeOptions.model_validate({"cache_dir": cache_dir, **options})
            done[key] = (
                create_backend(backend).compile(resolved.path, resolved.manifest, opts),
                resolved,
            )
        return done[key]

    return _compile


@pytest.fixture(scope="session")
def astronaut() -> npt.NDArray[np.uint8]:
    return bgr(sample("astronaut"))


@pytest.fixture(scope="session")
def coffee() -> npt.NDArray[np.uint8]:
    return bgr(sample("coffee"))


def espeak(text: str, out: Path) -> Path:
    """Speak `text` into a WAV file with espeak-ng (a real voice, no download)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.fail(
            "espeak-ng is not installed: run `make system-deps` (apt-get install espeak-ng)"
        )
    subprocess.run([exe, "-w", str(out), text], check=True, capture_output=True)
    return out


def write_wav(path: Path, samples: npt.NDArray[np.float32], rate: int) -> None:
    """Write mono float samples as a 16-bit PCM WAV file."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


@pytest.fixture
def camera() -> Iterator[str]:
    """The URL of an MJPEG camera sending the astronaut at 10 fps, stopped after the test."""
    server = MjpegServer(bgr(sample("astronaut")), free_port(), fps=10)
    server.start()
    yield server.url
    server.stop()
