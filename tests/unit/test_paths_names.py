"""What may be one path component: names of models, versions' folders, partial transfers."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.delivery.partial import sweep
from edge_agent.paths import is_safe_name


@pytest.mark.parametrize("name", ["orient", "person-ssdlite", "v1.2_int8", "a" * 128])
def test_plain_names_are_safe(name: str) -> None:
    assert is_safe_name(name)


@pytest.mark.parametrize(
    "name", ["orient\n", "orient\n\n", "", ".hidden", "a/b", "..", "a..b", "a" * 129, "ö"]
)
def test_names_that_are_not_one_plain_component_are_refused(name: str) -> None:
    # "orient\n" passed (Python's `$` matches before a final newline): its partial transfer
    # folder then matched no sweep pattern and was never removed.
    assert not is_safe_name(name)


def test_a_partial_folder_with_a_newline_in_its_name_is_not_taken_for_one(
    tmp_path: Path,
) -> None:
    odd = tmp_path / "orient\n-1-0123456789abcdef"
    odd.mkdir()
    keep = tmp_path / "orient-2-0123456789abcdef"
    assert sweep(tmp_path, keep=keep) == []
    assert odd.exists()  # not a partial of ours: left alone, never half-parsed
