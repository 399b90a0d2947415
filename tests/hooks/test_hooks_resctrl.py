"""resctrl (L3 CAT + MBA): the arithmetic, the info parsing and the filesystem layer against the fake kernel."""

from __future__ import annotations

import errno
import fcntl
import math
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.resctrl_fs import (
    PAGE_SIZE,
    BandwidthInfo,
    CacheInfo,
    InvalidGroupName,
    KernelOps,
    ResctrlCapacityError,
    ResctrlFS,
    ResctrlInfo,
    ResctrlTasksError,
    ResctrlUnsupported,
    ResctrlWriteError,
    l3_mask,
    l3_way_range,
    mb_value,
    parse_schemata,
    schemata_lines,
)
from runtimeproxy.hooks.testkit.fake_resctrl import (
    FakeKernelError,
    FakeResctrl,
    FakeResource,
    kernel_schemata_write,
    make_fake_resctrl,
)

pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures"]


def _runs(mask: int) -> int:
    """Number of separate runs of 1 bits in mask."""
    return (mask & ~(mask << 1)).bit_count()


# --------------------------------------------------------------------------------------
# l3_mask


@st.composite
def cache_geometry(draw: st.DrawFn) -> tuple[int, int]:
    width = draw(st.integers(1, 32))
    min_bits = draw(st.integers(0, width))
    return (1 << width) - 1, min_bits


percent_range = st.tuples(st.integers(0, 100), st.integers(0, 100)).filter(lambda r: r[0] < r[1])


def koordlet_mask(ways: int, start: int, end: int) -> int | None:
    """koordlet's mask for ``[start, end)`` percent of ``ways`` ways, computed its way: each
    end's way index is the ceiling of the float product ``ways * percent / 100``; the mask is
    ``2**hi - 2**lo``. None for the ranges it refuses (start < 0, end > 100, end <= start)."""
    if start < 0 or end > 100 or end <= start:
        return None
    lo = math.ceil(ways * float(start) / 100)
    hi = math.ceil(ways * float(end) / 100)
    return (1 << hi) - (1 << lo)


def test_l3_mask_is_koordlets_mask_for_every_way_count_and_range() -> None:
    """Every way count 1..32 and every 0 <= start < end <= 100: koordlet's mask, or a refusal
    exactly where koordlet's mask is empty (the kernel refuses an empty mask)."""
    for ways in range(1, 33):
        cbm_mask = (1 << ways) - 1
        for start in range(0, 100):
            for end in range(start + 1, 101):
                expected = koordlet_mask(ways, start, end)
                assert expected is not None
                if expected == 0:
                    with pytest.raises(ValueError, match="way"):
                        l3_mask(cbm_mask, 1, start, end)
                else:
                    assert l3_mask(cbm_mask, 1, start, end) == expected, (ways, start, end)


@given(cache_geometry(), st.integers(-20, 120), st.integers(-20, 120))
def test_l3_mask_matches_koordlet_or_refuses_what_the_kernel_or_koordlet_refuses(
    geometry: tuple[int, int], start: int, end: int
) -> None:
    cbm_mask, min_bits = geometry
    expected = koordlet_mask(cbm_mask.bit_length(), start, end)
    if expected is None or expected.bit_count() < max(1, min_bits):
        with pytest.raises(ValueError):
            l3_mask(cbm_mask, min_bits, start, end)
        return
    mask = l3_mask(cbm_mask, min_bits, start, end)
    assert mask == expected
    assert _runs(mask) == 1
    assert mask & ~cbm_mask == 0


@given(st.integers(1, 32), st.integers(0, 100), st.integers(0, 100), st.integers(0, 100))
def test_l3_adjacent_ranges_split_the_ways_without_sharing_one(ways: int, a: int, b: int, c: int) -> None:
    a, b, c = sorted((a, b, c))
    assume(a < b < c)
    lo_lo, lo_hi = l3_way_range(ways, a, b)
    hi_lo, hi_hi = l3_way_range(ways, b, c)
    assert lo_hi == hi_lo  # the boundary way belongs to the upper range only
    assert (lo_lo, hi_hi) == l3_way_range(ways, a, c)


@given(cache_geometry(), percent_range, st.integers(0, 100), st.integers(0, 100))
def test_l3_mask_wider_range_never_gives_fewer_ways(
    geometry: tuple[int, int], inner: tuple[int, int], widen_lo: int, widen_hi: int
) -> None:
    cbm_mask, min_bits = geometry
    outer = (max(0, inner[0] - widen_lo), min(100, inner[1] + widen_hi))
    try:
        narrow = l3_mask(cbm_mask, min_bits, *inner)
    except ValueError:
        return
    assert l3_mask(cbm_mask, min_bits, *outer).bit_count() >= narrow.bit_count()


@given(cache_geometry())
def test_l3_mask_full_range_is_the_full_mask(geometry: tuple[int, int]) -> None:
    cbm_mask, min_bits = geometry
    assert l3_mask(cbm_mask, min_bits, 0, 100) == cbm_mask


def test_l3_mask_examples() -> None:
    # 11 ways (cbm_mask 7ff): both ends rounded up to a whole way
    assert l3_mask(0x7FF, 1, 10, 50) == 0x3C
    assert l3_mask(0x7FF, 1, 20, 60) == 0x78  # ways 3..6 (2.2 and 6.6 rounded up)
    assert l3_mask(0x7FF, 1, 0, 30) == 0xF  # the default BE range
    assert l3_mask(0x7FF, 1, 0, 50) == 0x3F
    assert l3_mask(0x7FF, 1, 50, 100) == 0x7C0  # way 5 goes to the lower half only
    # 10 ways, 10-80 %
    assert l3_mask(0x3FF, 1, 10, 80) == 0xFE
    # resctrl.rst, "Cache Bit Masks (CBM)": a 20-bit mask split into four equal parts
    quarters = [l3_mask(0xFFFFF, 1, start, start + 25) for start in (0, 25, 50, 75)]
    assert quarters == [0x1F, 0x3E0, 0x7C00, 0xF8000]
    assert l3_mask(0x1, 1, 0, 1) == 0x1


@pytest.mark.parametrize(
    ("cbm_mask", "min_bits", "start", "end"),
    [
        (0x7FF, 1, 50, 50),  # empty range
        (0x7FF, 1, 60, 40),
        (0x7FF, 1, -1, 50),
        (0x7FF, 1, 0, 101),
        (0x7FE, 1, 0, 100),  # cbm_mask not from bit 0
        (0x5, 1, 0, 100),  # not contiguous
        (0, 1, 0, 100),
        (0xF, 5, 0, 100),  # min_cbm_bits wider than the cache
        (0xF, -1, 0, 100),
        (0x7FF, 1, 10, 15),  # ways [2, 2): no whole way
        (0x1, 1, 1, 100),  # one way, rounded up past it
        (0x7FF, 4, 99, 100),  # one way where the cache needs four
    ],
)
def test_l3_mask_rejects_bad_input(cbm_mask: int, min_bits: int, start: int, end: int) -> None:
    with pytest.raises(ValueError):
        l3_mask(cbm_mask, min_bits, start, end)


# --------------------------------------------------------------------------------------
# mb_value

_GRANS_DIVIDING_100 = [g for g in range(1, 101) if 100 % g == 0]


@given(st.integers(-50, 200), st.integers(1, 100), st.integers(1, 100))
def test_mb_value_in_range_and_monotonic(percent: int, min_bw: int, gran: int) -> None:
    value = mb_value(percent, min_bw, gran)
    assert min_bw <= value <= 100
    assert mb_value(percent + 1, min_bw, gran) >= value
    assert mb_value(value, min_bw, gran) == value  # idempotent


@given(st.integers(-50, 200), st.integers(1, 100), st.sampled_from(_GRANS_DIVIDING_100))
def test_mb_value_is_a_step_the_kernel_stores_unchanged(percent: int, min_bw: int, gran: int) -> None:
    value = mb_value(percent, min_bw, gran)
    assert value % gran == 0
    assert value >= min(max(percent, min_bw), 100)  # rounded up, never below the request
    mb = FakeResource(name="MB", domain_ids=(0,), num_closids=8, min_bandwidth=min_bw, bandwidth_gran=gran)
    stored = kernel_schemata_write(f"MB:0={value}\n".encode(), {"MB": mb}, {"MB": {0: 100}})
    assert stored["MB"][0] == value


def test_mb_value_examples() -> None:
    assert mb_value(35, 10, 10) == 40  # "rounded to the next control step"
    assert mb_value(40, 10, 10) == 40
    assert mb_value(0, 10, 10) == 10
    assert mb_value(5, 10, 10) == 10
    assert mb_value(150, 10, 10) == 100
    assert mb_value(33, 10, 1) == 33
    assert mb_value(95, 10, 15) == 100  # a granularity not dividing 100: capped, never above


@pytest.mark.parametrize(("min_bw", "gran"), [(0, 10), (101, 10), (10, 0)])
def test_mb_value_rejects_bad_hardware_values(min_bw: int, gran: int) -> None:
    with pytest.raises(ValueError):
        mb_value(50, min_bw, gran)


# --------------------------------------------------------------------------------------
# parse_schemata / schemata_lines


def test_parse_schemata_tolerates_kernel_display_formats() -> None:
    text = "    MB:0= 100;1=  50\n    L3:0=007ff;1=0x3f;\nL3CODE:uninitialized\n\n"
    assert parse_schemata(text) == {"MB": {0: 100, 1: 50}, "L3": {0: 0x7FF, 1: 0x3F}, "L3CODE": {}}
    with pytest.raises(ValueError):
        parse_schemata("L3:0=xyz\n")
    with pytest.raises(ValueError):
        parse_schemata("garbage\n")


def _info(*, cache_ids: tuple[int, ...] = (0, 1), mb_ids: tuple[int, ...] = (0, 1), cdp: bool = False) -> ResctrlInfo:
    l3 = CacheInfo(0x7FF, 1, 16, 0, cache_ids, cdp) if cache_ids else None
    mb = BandwidthInfo(10, 10, 16, True, mb_ids) if mb_ids else None
    return ResctrlInfo(l3=l3, mb=mb, num_closids=16)


def test_schemata_lines_examples() -> None:
    assert schemata_lines(_info(), (0, 50), 50) == "L3:0=3f;1=3f\nMB:0=50;1=50\n"
    assert schemata_lines(_info(), (0, 100)) == "L3:0=7ff;1=7ff\n"
    assert schemata_lines(_info(), mb_percent=35) == "MB:0=40;1=40\n"
    assert schemata_lines(_info(cache_ids=(0, 2), mb_ids=(0, 2)), (50, 100), 100) == "L3:0=7c0;2=7c0\nMB:0=100;2=100\n"
    assert schemata_lines(_info(cdp=True), (0, 50)) == "L3CODE:0=3f;1=3f\nL3DATA:0=3f;1=3f\n"


def test_schemata_lines_refuses_what_the_host_lacks() -> None:
    with pytest.raises(ResctrlUnsupported, match="L3"):
        schemata_lines(_info(cache_ids=()), (0, 50), 50)
    with pytest.raises(ResctrlUnsupported, match="memory bandwidth"):
        schemata_lines(_info(mb_ids=()), (0, 50), 50)
    amd = ResctrlInfo(l3=None, mb=BandwidthInfo(0, 1, 16, False, (0,), percent=False), num_closids=16)
    with pytest.raises(ResctrlUnsupported, match="not percentages"):
        schemata_lines(amd, mb_percent=50)
    with pytest.raises(ValueError, match="nothing to write"):
        schemata_lines(_info())


@st.composite
def fake_configs(draw: st.DrawFn) -> dict[str, object]:
    width = draw(st.integers(1, 20))
    has_l3 = draw(st.booleans())
    has_mb = draw(st.booleans()) or not has_l3
    ids = st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True)
    return {
        "cbm_mask": f"{(1 << width) - 1:x}",
        "min_cbm_bits": draw(st.integers(1, width)),
        "l3_ids": tuple(draw(ids)) if has_l3 else (),
        "mb_ids": tuple(draw(ids)) if has_mb else (),
        "min_bandwidth": draw(st.integers(1, 100)),
        "bandwidth_gran": draw(st.sampled_from(_GRANS_DIVIDING_100)),
        "cdp": draw(st.booleans()),
        "num_closids": draw(st.integers(2, 16)),
    }


@settings(max_examples=60, deadline=None)
@given(fake_configs(), percent_range, st.integers(0, 120))
def test_schemata_round_trip_through_the_fake_kernel(
    config: dict[str, object], rng: tuple[int, int], percent: int
) -> None:
    assume(not (config["cdp"] and int(str(config["num_closids"])) < 4))  # CDP halves: keep a free CLOSID
    with tempfile.TemporaryDirectory() as tmp:
        fake = make_fake_resctrl(Path(tmp) / "resctrl", **config)  # type: ignore[arg-type]
        fs = fake.fs()
        info = fs.info()
        fs.ensure_group("g")
        if info.l3 is not None:
            koordlets = koordlet_mask(info.l3.cbm_mask.bit_length(), *rng)
            assert koordlets is not None
            if koordlets.bit_count() < max(1, info.l3.min_cbm_bits):
                # refused before writing, as the kernel refuses koordlet's mask
                with pytest.raises(ValueError):
                    schemata_lines(info, rng)
                line = ";".join(f"{cache_id}={koordlets:x}" for cache_id in info.l3.cache_ids)
                with pytest.raises(ResctrlWriteError):
                    fs.write_schemata("g", "".join(f"{name}:{line}\n" for name in info.l3.schema_names))
                return
        text = schemata_lines(info, rng if info.l3 is not None else None, percent if info.mb is not None else None)
        fs.write_schemata("g", text)  # the fake kernel validates it like rdtgroup_schemata_write()
        assert fake.last_cmd_status == "ok\n"
        assert fs.schemata("g") == parse_schemata(text)  # read back exactly what was written
        assert fake.schemata_writes("g") == [text.encode()]


# --------------------------------------------------------------------------------------
# the fake kernel's validation (so that tests catch invalid writes)


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("L3:0=5\n", "The mask 5 has non-consecutive 1-bits\n"),
        ("L3:0=0\n", "Mask out of range\n"),
        ("L3:0=fff\n", "Mask out of range\n"),  # a bit outside cbm_mask 7ff
        ("L3:0=1\n", "Need at least 2 bits in the mask\n"),
        ("L3:0=xyz\n", "Non-hex character in the mask xyz\n"),
        ("MB:0=5\n", "MB value 5 out of range [10,100]\n"),
        ("MB:0=101\n", "MB value 101 out of range [10,100]\n"),
        ("MB:0=5O\n", "Invalid MB value 5O\n"),
        ("L3:9=7ff\n", ""),  # unknown cache id: EINVAL, and the kernel gives no reason
        ("L3: 0=7ff\n", "Missing '=' or non-numeric domain\n"),
        ("L3:0=7ff;0=3\n", "Duplicate domain 0\n"),
        ("L2:0=f\n", "Unknown or unsupported resource name 'L2'\n"),
        ("L3\n", "Missing ':'\n"),
        ("L3:\n", "Missing 'L3' value\n"),
        ("L3:0=7ff\n\n", "Missing ':'\n"),  # an empty line is a command too
    ],
)
def test_fake_kernel_rejects_invalid_schemata(tmp_path: Path, text: str, status: str) -> None:
    fake = make_fake_resctrl(tmp_path / "resctrl", min_cbm_bits=2)
    fs = fake.fs()
    fs.ensure_group("g")
    before = fake.schemata("g")
    with pytest.raises(ResctrlWriteError) as caught:
        fs.write_schemata("g", text)
    assert caught.value.errno == errno.EINVAL
    assert fake.last_cmd_status == (status or "ok\n")
    assert caught.value.status == (status.strip() or "ok")
    assert fake.schemata("g") == before


def test_fake_kernel_schemata_write_is_all_or_nothing(fake_resctrl: FakeResctrl) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("g")
    with pytest.raises(ResctrlWriteError):
        fs.write_schemata("g", "L3:0=3;1=3\nMB:0=5;1=50\n")
    assert fake_resctrl.schemata("g") == {"L3": {0: 0x7FF, 1: 0x7FF}, "MB": {0: 100, 1: 100}}
    # a partial write changes only the named domains, like the kernel
    fs.write_schemata("g", "L3:1=3\n")
    assert fake_resctrl.schemata("g") == {"L3": {0: 0x7FF, 1: 0x3}, "MB": {0: 100, 1: 100}}


def test_fake_kernel_needs_trailing_newline_and_keeps_old_status(fake_resctrl: FakeResctrl) -> None:
    fake_resctrl.fs().ensure_group("g")
    path = fake_resctrl.root / "g" / "schemata"
    with pytest.raises(FakeKernelError):
        fake_resctrl.write(path, b"L3:0=5\n")
    with pytest.raises(FakeKernelError) as caught:
        fake_resctrl.write(path, b"L3:0=3")  # refused before last_cmd_status is cleared
    assert caught.value.errno == errno.EINVAL
    assert fake_resctrl.last_cmd_status == "The mask 5 has non-consecutive 1-bits\n"
    with pytest.raises(FakeKernelError) as caught:
        fake_resctrl.write(path, b"L3:0=3;" * (PAGE_SIZE // 7 + 1) + b"\n")
    assert caught.value.errno == errno.E2BIG


def test_fake_kernel_rounds_mb_up_to_the_granularity(tmp_path: Path) -> None:
    fake = make_fake_resctrl(tmp_path / "resctrl", min_bandwidth=10, bandwidth_gran=10)
    fake.fs().ensure_group("g")
    fake.write(fake.root / "g" / "schemata", b"MB:0=35\n")
    assert fake.schemata("g")["MB"] == {0: 40, 1: 100}


def test_fake_kernel_files_are_never_read_half_rendered(fake_resctrl: FakeResctrl) -> None:
    """A kernel read is a snapshot. A reader polling a group's files while schemata and tasks
    are written sees each file whole, old or new: never the empty file a truncate leaves (the
    end-to-end tests read these files from another process while the hook server writes)."""
    fs = fake_resctrl.fs()
    fs.ensure_group("g")
    group = fake_resctrl.root / "g"
    fake_resctrl.write(group / "tasks", b"0")  # this thread: moved again and again below
    renders = {"    MB:0=100;1=100\n    L3:0=7ff;1=7ff\n", "    MB:0=50;1=50\n    L3:0=3;1=3\n"}
    seen: dict[str, set[str]] = {"schemata": set(), "tasks": set()}
    done = threading.Event()

    def read_until_done() -> None:
        while not done.is_set():
            for name, texts in seen.items():
                texts.add((group / name).read_text())

    reader = threading.Thread(target=read_until_done)
    reader.start()
    try:
        for _ in range(100):
            fs.write_schemata("g", "L3:0=3;1=3\nMB:0=50;1=50\n")
            fake_resctrl.write(group / "tasks", b"0")
            fs.write_schemata("g", "L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
    finally:
        done.set()
        reader.join()
    assert seen["schemata"] <= renders, seen["schemata"] - renders
    assert seen["tasks"] == {f"{threading.get_native_id()}\n"}
    assert len(seen["schemata"]) == 2
    assert sorted(p.name for p in group.iterdir() if p.name.startswith(".")) == []  # no rendering left over


# --------------------------------------------------------------------------------------
# ResctrlInfo from the (fake) mount


def test_info_from_the_default_fake(fake_resctrl: FakeResctrl) -> None:
    fs = fake_resctrl.fs()
    assert fs.available()
    info = fs.info()
    assert info.l3 == CacheInfo(cbm_mask=0x7FF, min_cbm_bits=1, num_closids=16, shareable_bits=0, cache_ids=(0, 1))
    assert info.mb == BandwidthInfo(10, 10, 16, True, (0, 1), percent=True)
    assert info.num_closids == 16
    assert info.max_groups == 15
    assert set(info.resources) == {"L3", "MB"}
    # the files look like the kernel's: names padded to L3CODE's width, MB listed first
    assert (fake_resctrl.root / "schemata").read_text() == "    MB:0=100;1=100\n    L3:0=7ff;1=7ff\n"
    assert (fake_resctrl.root / "info" / "L3" / "cbm_mask").read_text() == "7ff\n"
    assert (fake_resctrl.root / "info" / "last_cmd_status").read_text() == "ok\n"


def test_info_l3_only_and_mb_only(tmp_path: Path) -> None:
    l3_only = make_fake_resctrl(tmp_path / "a", mb_ids=(), l3_ids=(0,), shareable_bits="600").fs().info()
    assert l3_only.mb is None and l3_only.l3 is not None
    assert l3_only.l3.cache_ids == (0,) and l3_only.l3.shareable_bits == 0x600
    assert schemata_lines(l3_only, (0, 50)) == "L3:0=3f\n"

    mb_only = make_fake_resctrl(tmp_path / "b", l3_ids=None, mb_ids=(0, 1, 2, 3)).fs().info()
    assert mb_only.l3 is None and mb_only.mb is not None
    assert mb_only.mb.domain_ids == (0, 1, 2, 3)
    assert schemata_lines(mb_only, mb_percent=20) == "MB:0=20;1=20;2=20;3=20\n"


def test_info_cdp_writes_the_same_mask_to_code_and_data(tmp_path: Path) -> None:
    fake = make_fake_resctrl(tmp_path / "resctrl", cdp=True, num_closids=16)
    fs = fake.fs()
    info = fs.info()
    assert info.l3 is not None and info.l3.cdp
    assert info.num_closids == 8  # the kernel halves the CLOSIDs under CDP
    fs.ensure_group("g")
    fs.write_schemata("g", schemata_lines(info, (0, 50), 50))
    assert fake.schemata("g") == {"MB": {0: 50, 1: 50}, "L3DATA": {0: 0x3F, 1: 0x3F}, "L3CODE": {0: 0x3F, 1: 0x3F}}
    with pytest.raises(ResctrlWriteError, match="Unknown or unsupported resource name 'L3'"):
        fs.write_schemata("g", "L3:0=3\n")


def test_info_min_closids_over_resources_and_amd_style_mb(tmp_path: Path) -> None:
    info = make_fake_resctrl(tmp_path / "a", num_closids=16, mb_num_closids=8).fs().info()
    assert info.num_closids == 8 and info.max_groups == 7
    amd = make_fake_resctrl(tmp_path / "b", min_bandwidth=0, bandwidth_gran=1).fs().info()
    assert amd.mb is not None and not amd.mb.percent


def test_not_mounted(tmp_path: Path) -> None:
    assert not ResctrlFS(tmp_path / "missing").available()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not ResctrlFS(empty).available()
    with pytest.raises(ResctrlUnsupported, match="not a mounted resctrl"):
        ResctrlFS(empty).info()


# --------------------------------------------------------------------------------------
# groups


def test_ensure_group_creates_a_populated_group_once(fake_resctrl: FakeResctrl) -> None:
    fs = fake_resctrl.fs()
    path = fs.ensure_group("ls-pods")
    assert path == fake_resctrl.root / "ls-pods"
    for name in ("tasks", "cpus", "cpus_list", "schemata", "mode", "size"):
        assert (path / name).is_file(), name
    assert (path / "mode").read_text() == "shareable\n"
    assert (path / "tasks").read_text() == ""
    assert fs.schemata("ls-pods") == {"L3": {0: 0x7FF, 1: 0x7FF}, "MB": {0: 100, 1: 100}}
    assert fs.ensure_group("ls-pods") == path  # idempotent
    fs.ensure_group("be_pods")
    assert fs.groups() == ["be_pods", "ls-pods"]  # info/, mon_groups/, mon_data/ are not groups
    assert fake_resctrl.groups() == ["be_pods", "ls-pods"]


def test_write_schemata_is_one_write_with_every_line(fake_resctrl: FakeResctrl) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("be")
    text = schemata_lines(fs.info(), (0, 30), 20)
    assert text == "L3:0=f;1=f\nMB:0=20;1=20\n"
    fs.write_schemata("be", text)
    assert fake_resctrl.schemata_writes("be") == [b"L3:0=f;1=f\nMB:0=20;1=20\n"]
    assert fake_resctrl.schemata("be") == {"L3": {0: 0xF, 1: 0xF}, "MB": {0: 20, 1: 20}}
    assert (fake_resctrl.root / "be" / "schemata").read_text() == "    MB:0=20;1=20\n    L3:0=f;1=f\n"
    fs.write_schemata("be", "MB:0=30;1=30")  # the missing final newline is added
    assert fake_resctrl.schemata_writes("be")[-1] == b"MB:0=30;1=30\n"
    with pytest.raises(ValueError):
        fs.write_schemata("be", "\n")


def test_write_schemata_to_a_missing_group(fake_resctrl: FakeResctrl) -> None:
    with pytest.raises(Exception, match="ensure_group"):
        fake_resctrl.fs().write_schemata("nope", "MB:0=50\n")
    assert not (fake_resctrl.root / "nope").exists()


def test_kernel_ops_write_is_a_single_write_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "schemata"
    target.write_text("")
    calls: list[bytes] = []
    real_write = os.write

    def counting_write(fd: int, data: bytes) -> int:
        calls.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    KernelOps().write(target, b"L3:0=3f;1=3f\nMB:0=50;1=50\n")
    assert calls == [b"L3:0=3f;1=3f\nMB:0=50;1=50\n"]
    assert target.read_bytes() == b"L3:0=3f;1=3f\nMB:0=50;1=50\n"
    with pytest.raises(OSError) as caught:
        KernelOps().write(target, b"x" * (PAGE_SIZE + 1))
    assert caught.value.errno == errno.E2BIG
    assert len(calls) == 1
    KernelOps().mkdir(tmp_path / "g")  # the real-kernel mkdir is a plain mkdir
    assert list((tmp_path / "g").iterdir()) == []


BAD_NAMES = ["..", ".", "", "a/b", "/x", "../x", "info", "mon_groups", "mon_data", "a\n", "a b", "a.b", "é", "x" * 256]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_group_names_cannot_escape_or_clash(fake_resctrl: FakeResctrl, tmp_path: Path, name: str) -> None:
    fs = fake_resctrl.fs()
    before = sorted(p.name for p in tmp_path.iterdir())
    calls: list[Callable[[], object]] = [
        lambda: fs.ensure_group(name),
        lambda: fs.write_schemata(name, "MB:0=50\n"),
        lambda: fs.add_tasks(name, [os.getpid()]),
        lambda: fs.tasks(name),
        lambda: fs.remove_group(name),
        lambda: fs.schemata(name),
    ]
    for call in calls:
        with pytest.raises(InvalidGroupName):
            call()
    assert fake_resctrl.writes == []
    assert fs.groups() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_group_symlinked_out_of_the_root_is_refused(fake_resctrl: FakeResctrl, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (fake_resctrl.root / "evil").symlink_to(outside)
    fs = fake_resctrl.fs()
    with pytest.raises(InvalidGroupName, match="outside"):
        fs.ensure_group("evil")
    with pytest.raises(InvalidGroupName):
        fs.write_schemata("evil", "MB:0=50\n")
    assert "evil" not in fs.groups()
    assert list(outside.iterdir()) == []


def test_a_checked_group_path_is_remembered_and_a_refused_one_refused_again(
    fake_resctrl: FakeResctrl, tmp_path: Path
) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("kept")
    path = fs.group_path("kept")
    assert fs.group_path("kept") is path  # remembered: no second resolution
    fake_resctrl.rmdir(fake_resctrl.root / "kept")
    assert fs.group_path("kept") == fake_resctrl.root / "kept"  # removed: the same path, as before
    fs.ensure_group("kept")
    assert fs.group_path("kept") == path and "kept" in fs.groups()
    outside = tmp_path / "outside"
    outside.mkdir()
    (fake_resctrl.root / "evil").symlink_to(outside)
    for _ in range(2):  # refusals are not remembered
        with pytest.raises(InvalidGroupName, match="outside"):
            fs.group_path("evil")
    with pytest.raises(InvalidGroupName):
        fs.group_path("../x")


def test_closid_limit(tmp_path: Path) -> None:
    fake = make_fake_resctrl(tmp_path / "resctrl", num_closids=4)
    fs = fake.fs()
    for name in ("a", "b", "c"):  # 4 CLOSIDs: the root group holds one
        fs.ensure_group(name)
    with pytest.raises(ResctrlCapacityError, match="4 CLOSIDs"):
        fs.ensure_group("d")
    assert not (fake.root / "d").exists()
    fs.ensure_group("a")  # an existing group needs no CLOSID
    assert fs.remove_group("b")
    fs.ensure_group("d")  # the freed CLOSID is reused
    assert fs.groups() == ["a", "c", "d"]


def test_closid_limit_under_cdp(tmp_path: Path) -> None:
    fs = make_fake_resctrl(tmp_path / "resctrl", num_closids=4, cdp=True).fs()
    fs.ensure_group("a")  # 4 hardware CLOSIDs, 2 under CDP, one of them the root's
    with pytest.raises(ResctrlCapacityError):
        fs.ensure_group("b")


def test_kernel_enospc_on_mkdir_is_a_capacity_error(tmp_path: Path) -> None:
    """Another agent takes the last CLOSID between our count and our mkdir: the kernel's ENOSPC."""
    fake = make_fake_resctrl(tmp_path / "resctrl", num_closids=3)

    class Racy:
        rmdir = fake.rmdir
        write = fake.write

        def mkdir(self, path: Path) -> None:
            if path.name == "b":
                fake.mkdir(path.parent / "intruder")
            fake.mkdir(path)

    fs = ResctrlFS(fake.root, ops=Racy())
    fs.ensure_group("a")
    with pytest.raises(ResctrlCapacityError, match="Out of CLOSIDs"):
        fs.ensure_group("b")
    assert fs.groups() == ["a", "intruder"]


def test_remove_group_returns_its_tasks_to_the_root(fake_resctrl: FakeResctrl, sleeper: Callable[[], int]) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("be")
    pid = sleeper()
    fs.add_tasks("be", [pid])
    assert fs.remove_group("be")
    assert not (fake_resctrl.root / "be").exists()
    assert pid in fake_resctrl.tasks()
    assert fs.remove_group("be") is False
    assert fs.groups() == []


def test_plain_mkdir_then_sync(fake_resctrl: FakeResctrl, tmp_path: Path) -> None:
    os.mkdir(fake_resctrl.root / "manual")
    assert fake_resctrl.sync() == ["manual"]
    assert (fake_resctrl.root / "manual" / "schemata").read_text() == "    MB:0=100;1=100\n    L3:0=7ff;1=7ff\n"
    assert fake_resctrl.fs().groups() == ["manual"]

    small = make_fake_resctrl(tmp_path / "small", num_closids=2)
    os.mkdir(small.root / "one")
    os.mkdir(small.root / "two")
    with pytest.raises(FakeKernelError) as caught:
        small.sync()
    assert caught.value.errno == errno.ENOSPC
    assert small.groups() == ["one"] and not (small.root / "two").exists()


def test_mutations_wait_for_the_resctrl_flock(fake_resctrl: FakeResctrl) -> None:
    fs = fake_resctrl.fs()
    fd = os.open(fake_resctrl.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another application holds the lock
        worker = threading.Thread(target=fs.ensure_group, args=("g",))
        worker.start()
        worker.join(0.3)
        assert worker.is_alive() and not (fake_resctrl.root / "g").exists()
        fcntl.flock(fd, fcntl.LOCK_UN)
        worker.join(5)
        assert not worker.is_alive()
    finally:
        os.close(fd)
    assert fs.groups() == ["g"]


# --------------------------------------------------------------------------------------
# tasks


@pytest.fixture
def sleeper() -> Iterator[Callable[[], int]]:
    """Start real processes (``sleep``) and return their pids; all are killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        proc = subprocess.Popen(["sleep", "60"])
        procs.append(proc)
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid names no task any more
    return proc.pid


def test_add_tasks_one_write_per_pid(fake_resctrl: FakeResctrl, sleeper: Callable[[], int]) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("be")
    pids = [sleeper(), sleeper()]
    result = fs.add_tasks("be", pids)
    assert result.moved == tuple(pids) and result.exited == () and not result.failed
    assert fs.tasks("be") == set(pids)
    tasks_path = fake_resctrl.root / "be" / "tasks"
    assert [w.data for w in fake_resctrl.writes if w.path == tasks_path] == [f"{p}\n".encode() for p in pids]


def test_add_tasks_moves_between_groups(fake_resctrl: FakeResctrl, sleeper: Callable[[], int]) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("a")
    fs.ensure_group("b")
    pid = sleeper()
    fs.add_tasks("a", [pid])
    fs.add_tasks("b", [pid])
    assert fs.tasks("a") == set()
    assert fs.tasks("b") == {pid}


def test_add_tasks_ignores_exited_tasks(fake_resctrl: FakeResctrl, sleeper: Callable[[], int]) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("be")
    alive, dead = sleeper(), _dead_pid()
    result = fs.add_tasks("be", [dead, alive])
    assert result.moved == (alive,)
    assert result.exited == (dead,)
    assert fs.tasks("be") == {alive}
    assert fake_resctrl.last_cmd_status == "ok\n"  # the later successful write reset it


def test_fake_kernel_forgets_exited_tasks(fake_resctrl: FakeResctrl, sleeper: Callable[[], int]) -> None:
    # A kernel's tasks file lists live tasks only; the fake's must not grow with every container
    # that came and went.
    fs = fake_resctrl.fs()
    fs.ensure_group("be")
    leaving = subprocess.Popen(["sleep", "60"])
    staying = sleeper()
    fs.add_tasks("be", [leaving.pid, staying])
    leaving.kill()
    leaving.wait()
    assert fake_resctrl.tasks("be") == [staying]  # at once
    assert fs.tasks("be") == {leaving.pid, staying}  # the file: until it is rendered again
    joining = sleeper()
    fs.add_tasks("be", [joining])
    assert fs.tasks("be") == {staying, joining}
    assert fake_resctrl.tasks("be") == [staying, joining]


def test_add_tasks_reports_other_failures_after_trying_all(
    fake_resctrl: FakeResctrl, sleeper: Callable[[], int]
) -> None:
    denied = sleeper()

    class Denying:
        mkdir = fake_resctrl.mkdir
        rmdir = fake_resctrl.rmdir

        def write(self, path: Path, data: bytes) -> None:
            if path.name == "tasks" and data == f"{denied}\n".encode():
                raise FakeKernelError(errno.EPERM)
            fake_resctrl.write(path, data)

    fs = ResctrlFS(fake_resctrl.root, ops=Denying())
    fs.ensure_group("be")
    ok, dead = sleeper(), _dead_pid()
    with pytest.raises(ResctrlTasksError) as caught:
        fs.add_tasks("be", [denied, dead, ok])
    result = caught.value.result
    assert result.moved == (ok,) and result.exited == (dead,)
    assert set(result.failed) == {denied} and "Operation not permitted" in result.failed[denied]
    assert fs.tasks("be") == {ok}


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "123"])
def test_add_tasks_refuses_non_pids(fake_resctrl: FakeResctrl, bad: object) -> None:
    fs = fake_resctrl.fs()
    fs.ensure_group("be")
    with pytest.raises(ValueError):
        fs.add_tasks("be", [bad])  # type: ignore[list-item]
    assert fake_resctrl.writes == []


def test_fake_kernel_tasks_parsing(fake_resctrl: FakeResctrl, sleeper: Callable[[], int]) -> None:
    fake_resctrl.fs().ensure_group("be")
    path = fake_resctrl.root / "be" / "tasks"
    a, b = sleeper(), sleeper()
    fake_resctrl.write(path, f"{a},{b}\n".encode())  # newer kernels take a comma list
    assert fake_resctrl.tasks("be") == [a, b]
    with pytest.raises(FakeKernelError) as caught:
        fake_resctrl.write(path, b"abc\n")
    assert caught.value.errno == errno.EINVAL
    assert fake_resctrl.last_cmd_status == "Task list parsing error pid abc\n"
    dead = _dead_pid()
    with pytest.raises(FakeKernelError) as caught:
        fake_resctrl.write(path, f"{dead}\n".encode())
    assert caught.value.errno == errno.ESRCH
    assert fake_resctrl.last_cmd_status == f"No task {dead}\nError while processing task {dead}\n"


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), st.text("0123456789\n\r ,-", max_size=200).map(str.encode)))
def test_a_file_reads_as_text_mode_reads_it(data: bytes) -> None:
    """The plain-read(2) reader gives what ``Path.read_text("ascii")`` gives, or refuses alike."""
    from runtimeproxy.hooks import resctrl_fs as resctrl_mod

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tasks"
        path.write_bytes(data)
        try:
            want: str | None = path.read_text(encoding="ascii")
        except UnicodeDecodeError:
            want = None
        if want is None:
            with pytest.raises(resctrl_mod.ResctrlError, match="cannot read"):
                resctrl_mod._read(path)
        else:
            assert resctrl_mod._read(path) == want
        with pytest.raises(resctrl_mod.ResctrlError, match="cannot read"):
            resctrl_mod._read(Path(scratch) / "missing")
