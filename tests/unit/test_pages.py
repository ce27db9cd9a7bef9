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
