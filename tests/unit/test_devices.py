"""Device requests: parsing, ordering, CPU fallback, and presence checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.devices import explain_failure, is_present, parse_request
from edge_agent.runtime.precision import combine, precision_note

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


@pytest.mark.parametrize(
    "bad",
    ["", "   ", "GPU,,CPU", "GPU,", ",CPU", "GPU>>CPU", "GPU, ,CPU", "AUTO:", "MULTI:GPU,,CPU"],
)
def test_empty_entries_are_rejected(bad: str) -> None:
    with pytest.raises(EdgeAgentError, match="empty device name") as info:
        parse_request(bad)
    assert info.value.fix, "the error says what to use instead"
    assert info.value.code == "device.invalid"


@pytest.mark.parametrize(
    "bad", ["TPU", "cuda:0", "GPU,TPU", "GPU.", "GPU.x", "GPU-1", "CPU.0", "MYRIAD", "AUTOX"]
)
def test_unknown_names_are_rejected_and_named(bad: str) -> None:
    with pytest.raises(EdgeAgentError, match="unknown device") as info:
        parse_request(bad)
    assert info.value.fix
    assert info.value.code == "device.invalid"


@pytest.mark.parametrize(
    ("bad", "name"),
    [
        ("AUTO:TPU", "TPU"),
        ("auto:gpu,tpu", "TPU"),
        ("MULTI:CPU,MYRIAD", "MYRIAD"),
        ("HETERO:GPU,cuda:0", "CUDA:0"),
        ("HETERO:-CPU", "-CPU"),  # only AUTO takes the "all but" form
        ("AUTO:GPU.x", "GPU.X"),
        ("AUTO:AUTO", "AUTO"),
    ],
)
def test_devices_inside_a_virtual_device_are_checked_like_plain_ones(bad: str, name: str) -> None:
    with pytest.raises(EdgeAgentError, match="unknown device") as info:
        parse_request(bad)
    assert repr(name) in info.value.problem, "the bad name itself is named"
    assert info.value.code == "device.invalid"


@pytest.mark.parametrize("name", ["TPU", "MYRIAD", "GPU.x", "CPU.0", "GPU-1"])
@pytest.mark.parametrize("kind", ["AUTO", "MULTI", "HETERO"])
def test_plain_and_virtual_requests_refuse_the_same_names(name: str, kind: str) -> None:
    for text in (name, f"{kind}:{name}", f"{kind}:GPU,{name}"):
        with pytest.raises(EdgeAgentError, match="unknown device") as info:
            parse_request(text)
        assert info.value.code == "device.invalid"


def test_auto_may_exclude_a_device() -> None:
    assert parse_request("AUTO:-CPU") == ["AUTO:-CPU", "CPU"]
    assert parse_request("auto:gpu,-npu") == ["AUTO:GPU,-NPU", "CPU"]


OPENCL = (
    'Cannot load library "/venv/lib/python3.11/site-packages/openvino/libs/'
    'libopenvino_intel_gpu_plugin.so": libOpenCL.so.1: cannot open shared object file: '
    "No such file or directory"
)


def test_missing_opencl_is_said_in_our_words() -> None:
    said = explain_failure(OPENCL)
    assert said == "no OpenCL runtime (libOpenCL.so.1) installed; install intel-opencl-icd"


def test_missing_npu_driver_is_said_in_our_words() -> None:
    said = explain_failure(
        'Cannot load library "/x/libs/libopenvino_intel_npu_compiler_loader.so": '
        "/x/libs/libopenvino_intel_npu_compiler_loader.so: cannot open shared object file"
    )
    assert said.startswith("no NPU driver installed")


def test_other_library_failures_lose_the_install_paths() -> None:
    said = explain_failure('Cannot load library "/a/b/libfoo.so": /c/d/libbar.so.2: bad ELF')
    assert said == "cannot load libfoo.so: libbar.so.2: bad ELF"


def test_other_messages_pass_through() -> None:
    assert explain_failure("clCreateContext failed") == "clCreateContext failed"


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


# What each device runs at, and the note when that is not what was asked for.


def test_a_default_precision_needs_no_note() -> None:
    assert precision_note(None, {"CPU": "bf16"}, {"CPU": ["BF16", "FP32"]}) == ""


def test_an_honoured_precision_needs_no_note() -> None:
    assert precision_note("f32", {"CPU": "f32"}, {"CPU": ["BF16", "FP32"]}) == ""


def test_a_device_without_the_arithmetic_says_so() -> None:
    note = precision_note("f16", {"CPU": "bf16"}, {"CPU": ["BF16", "WINOGRAD", "FP32", "INT8"]})
    assert (
        note
        == "f16 requested, CPU runs bf16: CPU has no f16 arithmetic (it computes in BF16, FP32)"
    )


def test_a_device_that_ignores_the_hint_says_that_instead() -> None:
    note = precision_note("bf16", {"GPU": "f16"}, {"GPU": ["FP16", "BF16", "FP32"]})
    assert note == "bf16 requested, GPU runs f16: GPU did not apply the bf16 hint to this model"
    assert "did not apply" in precision_note("f16", {"NPU": "f32"}, {})


def test_only_the_devices_that_differ_are_named() -> None:
    note = precision_note("f16", {"CPU": "bf16", "GPU": "f16"}, {"CPU": ["BF16", "FP32"]})
    assert note.startswith("f16 requested, CPU runs bf16")
    assert "GPU" not in note


def test_one_precision_for_devices_that_agree() -> None:
    assert combine({"CPU": "bf16"}) == "bf16"
    assert combine({"CPU": "f32", "GPU": "f32"}) == "f32"
    assert combine({"CPU": "bf16", "GPU": "f16"}) == "CPU:bf16,GPU:f16"
