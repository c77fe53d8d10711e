"""A cached IR cut short costs a conversion, never the model.

The prepared IR was renamed into place with nothing synced, so a power cut could leave a
0-byte .xml (or a short .bin) behind the right name. Every later start took it for a cache
hit, the compile failed, and it was reported as `device.unavailable` with "run edge-agent
doctor": that model was dead on the box until someone deleted the cache by hand. The cache
is rebuildable by design, so a damaged pair is deleted and converted again.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.runtime.openvino_backend import OpenVinoBackend

ORIENT = "text-orientation"  # the smallest reference model: a conversion of well under 1 s


def _empty_xml(xml: Path) -> None:
    xml.write_bytes(b"")


def _short_bin(xml: Path) -> None:
    weights = xml.with_suffix(".bin")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


@pytest.mark.parametrize("damage", [_empty_xml, _short_bin], ids=["empty xml", "short bin"])
def test_a_damaged_cached_ir_is_converted_again_and_said(
    damage: Callable[[Path], None],
    resolve: Callable[[str], ResolvedModel],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    orient = resolve(ORIENT)
    cache = tmp_path / "cache"
    options = RuntimeOptions(device="CPU", cache_dir=cache)
    OpenVinoBackend().compile(orient.path, orient.manifest, options)
    [xml] = (cache / "ir").glob("*.xml")
    damage(xml)
    shutil.rmtree(cache / "compiled", ignore_errors=True)  # no blob to load in its place

    caplog.set_level(logging.WARNING)
    model = OpenVinoBackend().compile(orient.path, orient.manifest, options)

    assert model.report.device == "CPU"
    assert xml.stat().st_size > 0, "the IR is written again"
    said = [r for r in caplog.records if getattr(r, "event", None) == "ir_cache_damaged"]
    assert len(said) == 1
    assert said[0].fields["ir"] == str(xml)  # type: ignore[attr-defined]
    # Written again whole: the next start compiles from it with nothing to mend.
    caplog.clear()
    OpenVinoBackend().compile(orient.path, orient.manifest, options)
    assert not [r for r in caplog.records if getattr(r, "event", None) == "ir_cache_damaged"]
