"""Device requests: parsing, ordering, CPU fallback, and presence checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.devices import is_present, parse_request

PHYSICAL = ["CPU", "GPU", "NPU", "GPU.0", "GPU.1", "GPU.12", "NPU.0"]


@st.composite
def any_case(draw: st.DrawFn, name: str) -> str:
    """`name` with each letter independently upper- or lower-cased."""
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.lower() if flip else c for c, flip in zip(name, flips, strict=True))


@st.composite
def request_st(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A device request string and the upper-case names it lists, in order."""
    names = draw(st.lists(st.sampled_from(PHYSICAL), min_size=1, max_size=8))
    text = draw(any_case(names[0]))
    for name in names[1:]:
        sep = draw(st.sampled_from([",", ">", " , ", " > ", ",  "]))
        text += sep + draw(any_case(name))
    pad = draw(st.sampled_from(["", " ", "  "]))
    return pad + text + pad, names


@pytest.mark.parametrize("device", ["GPU", "NPU", "GPU.1", "NPU.0"])
def test_single_device_gets_cpu_as_last_resort(device: str) -> None:
    assert parse_request(device) == [device, "CPU"]


def test_cpu_alone_is_just_cpu() -> None:
    assert parse_request("CPU") == ["CPU"]


def test_list_keeps_its_order_and_appends_cpu() -> None:
    assert parse_request("NPU,GPU.1") == ["NPU", "GPU.1", "CPU"]


def test_list_that_names_cpu_keeps_cpu_where_it_was_put() -> None:
    assert parse_request("CPU,GPU") == ["CPU", "GPU"]


def test_duplicates_are_dropped_keeping_the_first() -> None:
    assert parse_request("GPU,NPU,GPU,CPU,NPU") == ["GPU", "NPU", "CPU"]


@pytest.mark.parametrize(
    "request_", ["gpu,cpu", "Gpu , Cpu", "GPU>CPU", "gpu > cpu", "  GPU,CPU  ", "GPU>cpu"]
)
def test_case_spacing_and_both_separators(request_: str) -> None:
    assert parse_request(request_) == ["GPU", "CPU"]


@pytest.mark.parametrize(
    "virtual", ["AUTO", "MULTI:GPU,CPU", "HETERO:GPU.1,CPU", "AUTO:NPU,GPU,CPU", "auto:gpu,cpu"]
)
def test_virtual_device_is_one_candidate_not_split(virtual: str) -> None:
    got = parse_request(virtual)
    assert got[0] == virtual.upper()
    # The comma inside a virtual device is its own list, not ours to split.
    assert "GPU" not in got
    assert got[-1] == "CPU"
    assert len(got) == len(set(got))


@pytest.mark.parametrize("bad", ["", "   ", "GPU,,CPU", "GPU,", ",CPU", "GPU>>CPU", "GPU, ,CPU"])
def test_empty_entries_are_rejected(bad: str) -> None:
    with pytest.raises(EdgeAgentError, match="empty device name") as info:
        parse_request(bad)
    assert info.value.fix, "the error says what to use instead"


@pytest.mark.parametrize(
    "bad", ["TPU", "cuda:0", "GPU,TPU", "GPU.", "GPU.x", "GPU-1", "CPU.0", "AUTO:", "MYRIAD"]
)
def test_unknown_names_are_rejected_and_named(bad: str) -> None:
    with pytest.raises(EdgeAgentError, match="unknown device") as info:
        parse_request(bad)
    assert info.value.fix


@given(request_st())
def test_any_valid_list_is_ordered_deduped_with_cpu_fallback(
    case: tuple[str, list[str]],
) -> None:
    text, names = case
    got = parse_request(text)
    assert len(got) == len(set(got)), "no duplicates"
    assert set(got) == set(names) | {"CPU"}, "nothing lost, nothing invented"
    if "CPU" not in names:
        assert got[-1] == "CPU", "CPU appended as the last resort"
    # First-seen order of what was asked for is kept.
    asked = [d for d in got if d in names]
    assert asked == sorted(asked, key=names.index)


@given(st.sampled_from(["AUTO", "MULTI", "HETERO"]), st.lists(st.sampled_from(PHYSICAL)))
def test_any_virtual_request_passes_through_whole(kind: str, devices: list[str]) -> None:
    text = kind + (":" + ",".join(devices) if devices else "")
    assert parse_request(text.lower())[0] == text


def test_plain_gpu_matches_any_enumerated_gpu() -> None:
    assert is_present("GPU", ["CPU", "GPU"])
    assert is_present("GPU", ["CPU", "GPU.0", "GPU.1"])
    assert is_present("GPU", ["CPU", "GPU.1"])
    assert not is_present("GPU", ["CPU", "NPU"])
    assert not is_present("GPU", [])


def test_plain_name_does_not_match_a_longer_name_sharing_its_prefix() -> None:
    assert not is_present("GPU", ["CPU", "GPUX"])
    assert not is_present("NPU", ["NPU2"])


def test_numbered_device_needs_an_exact_match() -> None:
    assert is_present("GPU.1", ["CPU", "GPU.0", "GPU.1"])
    assert not is_present("GPU.1", ["CPU", "GPU.0"])
    assert not is_present("GPU.1", ["CPU", "GPU.10"])


def test_cpu_presence() -> None:
    assert is_present("CPU", ["CPU"])
    assert not is_present("CPU", ["GPU"])


@pytest.mark.parametrize("virtual", ["AUTO", "MULTI:GPU,CPU", "HETERO:GPU,CPU"])
def test_virtual_device_needs_any_device(virtual: str) -> None:
    assert is_present(virtual, ["CPU"])
    assert is_present(virtual, ["NPU"])
    assert not is_present(virtual, [])


def test_gpu_0_is_present_on_a_single_gpu_box() -> None:
    # OpenVINO lists a lone GPU as "GPU" and documents it as an alias of "GPU.0".
    assert is_present("GPU.0", ["CPU", "GPU"])
    assert not is_present("GPU.1", ["CPU", "GPU"])
