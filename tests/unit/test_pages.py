"""store.pages: resident pages of a memory-mapped table given back, the table unchanged."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

from tracelens.store import pages
from tracelens.store.atomic import write_ipc
from tracelens.store.cache import read_ipc

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise / smaps: Linux only")


def _mapping_rss_kib(address: int) -> int:
    """Resident KiB of the mapping of this process that holds `address` (/proc/self/smaps)."""
    rss, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("Rss:"):
                rss = int(line.split()[1])
    assert rss is not None, "no mapping holds that address"
    return rss


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table(
        {"a": rng.integers(0, 2**40, n), "b": rng.random(n), "name": [f"k{i % 13}" for i in range(n)]}
    )


@linux
def test_release_drops_resident_pages_and_keeps_the_values(tmp_path):
    want = _table(1_000_000)  # ~20 MB
    write_ipc(tmp_path / "t.arrow", want)
    t = read_ipc(tmp_path / "t.arrow")
    assert t.equals(want)  # touches every page
    addr = t.column("a").chunks[0].buffers()[1].address
    before = _mapping_rss_kib(addr)
    assert before > 8 * 1024
    freed = pages.release(t)
    assert freed >= 16 * 2**20
    assert _mapping_rss_kib(addr) < before / 8
    assert t.equals(want)  # read again from the file, unchanged
    assert _mapping_rss_kib(addr) > before / 2


def test_release_leaves_memory_it_did_not_map_alone():
    t = _table(200_000)  # in process memory: advising it away would zero it
    copy = pa.table({c: pa.array(t.column(c).to_pylist()) for c in t.column_names})
    assert pages.release(t) == 0
    assert pages.release(None) == 0
    assert t.equals(copy)


@linux
def test_a_collected_table_is_forgotten(tmp_path):
    write_ipc(tmp_path / "t.arrow", _table(10_000))
    t = read_ipc(tmp_path / "t.arrow")
    key = id(t)
    assert key in pages._MAPS
    del t
    assert key not in pages._MAPS


# (glibc's malloc statistics, in a probe interpreter)
_MALLINFO = """
import ctypes, sys
import numpy as np
from tracelens.store import pages

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

info = ctypes.CDLL(None).mallinfo2
info.restype = MallInfo2
"""

_MMAP_PROBE = (
    _MALLINFO
    + """capped = pages.cap_mmap_threshold() if sys.argv[1] == "cap" else None
a = np.ones(20 << 20, np.uint8)
del a  # a freed 20 MiB mapping: glibc's dynamic threshold rises to 20 MiB
b = np.ones(18 << 20, np.uint8)
print(capped, info().hblkhd >> 20)  # MiB in mappings of their own
"""
)


def _probe(script: str, cases: tuple[str, ...]) -> dict[str, list[str]]:
    """The words a probe script prints, per case, each in a fresh interpreter (the allocator's settings are
    process-wide)."""
    import ctypes
    import subprocess

    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc older than 2.33 (no mallinfo2)")
    out = {}
    for case in cases:
        res = subprocess.run([sys.executable, "-c", script, case], capture_output=True, text=True, check=True)
        out[case] = res.stdout.split()
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt / mallinfo2 (Linux)")
def test_capped_mmap_threshold_keeps_large_arrays_in_their_own_mappings():
    """After a large array is freed, glibc's dynamic threshold puts the next array below that size on the heap
    (its pages stay resident once freed); with the threshold capped at 16 MiB an 18 MiB array gets a mapping
    of its own. Each case in a fresh interpreter (the setting is process-wide)."""
    out = _probe(_MMAP_PROBE, ("default", "cap"))
    assert out["default"] == ["None", "0"]  # on the heap: the dynamic threshold was raised to 20 MiB
    assert out["cap"] == ["True", "18"]


_WORKER_PROBE = (
    _MALLINFO
    + """set_ = pages.worker_allocator() if sys.argv[1] == "worker" else None
a = np.ones(40 << 20, np.uint8)
mapped = info().hblkhd >> 20  # MiB in mappings of their own
del a
print(set_, mapped, info().arena >> 20)  # and MiB of heap kept once it is freed
"""
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt / mallinfo2 (Linux)")
def test_worker_allocator_reuses_the_heap():
    """A pool worker's allocator (`worker_allocator`): a 40 MiB array comes from the heap and its memory stays
    there once freed (for the next rank), where glibc's defaults give it a mapping of its own, handed back."""
    out = _probe(_WORKER_PROBE, ("default", "worker"))
    assert out["default"][:2] == ["None", "40"] and int(out["default"][2]) < 40
    assert out["worker"][:2] == ["True", "0"] and int(out["worker"][2]) >= 40


@linux
def test_trim_heap_over_trims_only_above_its_limit():
    rss = pages.resident_bytes()
    assert 10 << 20 < rss < 1 << 40  # (this interpreter, with NumPy and Arrow loaded)
    assert pages.trim_heap_over(rss + (1 << 30)) is False
    assert pages.trim_heap_over(0) is True
