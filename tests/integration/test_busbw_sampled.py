"""Bus bandwidth of a sampled job: HTA's trace_filter holds 2 ranks of a 128-rank job (distributedInfo
world_size 128, no Group size on its NCCL kernels, no pg_config): the nccl-tests factor takes n = 128, and
the tables say so (docs/stragglers.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import tracelens

REPO = Path(__file__).resolve().parents[2]
TRACE_FILTER = REPO.parent / "shared" / "traces" / "hta" / "trace_filter"


def test_trace_filter_allreduce_busbw_uses_the_world_size():
    if not TRACE_FILTER.is_dir():
        pytest.skip("../shared/traces/hta/trace_filter is absent")
    with gzip.open(TRACE_FILTER / "sampled_rank-0.json.gz") as fh:
        world = json.loads(fh.read())["distributedInfo"]["world_size"]
    assert world == 128
    run = tracelens.load(TRACE_FILTER, no_cache=True)
    coll = run.collectives()
    ar = coll[coll["op"] == "allreduce"]
    assert len(ar) and (ar["bus_n"] == 128).all() and (ar["bus_n_from"] == "world_size").all()
    timed = ar[ar["algbw_gbps"].notna()]
    assert len(timed)
    assert timed["busbw_gbps"].tolist() == pytest.approx((timed["algbw_gbps"] * 2 * 127 / 128).tolist())
    rec = next(r for r in run.summary()["collectives"]["by_op"] if r["op"] == "allreduce")
    assert rec["busbw_n"] == "128 (world size)"
