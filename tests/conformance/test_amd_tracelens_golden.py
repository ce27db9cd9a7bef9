"""tracelens vs AMD TraceLens's GPU timeline where the two define a quantity the same way: over the window from
the first to the last device event of a trace (all kernels, linked or not: `include_unlinked_kernels`),
the idle share (window minus the union of all device events) always, and the computation share where both
classify the same kernels as computation (no memset, memory-named or non-"nccl" communication kernels).

Golden numbers: tests/golden/amd_tracelens_gpu_timeline.json, written by scripts/amd_tracelens_golden.py (an
independent re-implementation of AMD TraceLens's GPUEventAnalyser on the raw JSON; see its provenance)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.rank.breakdown import class_sets
from tracelens.ingest import kineto

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
GOLDEN = json.loads(
    (Path(__file__).resolve().parents[1] / "golden" / "amd_tracelens_gpu_timeline.json").read_text()
)
FILES = sorted(GOLDEN["files"])
TOL_PP = 0.5

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not found at {TRACES}")


def test_golden_covers_the_gpu_traces():
    assert len(FILES) >= 30 and any(f.startswith("more/") for f in FILES)


@pytest.mark.parametrize("rel", FILES)
def test_gpu_timeline_agrees(rel):
    g = GOLDEN["files"][rel]
    ev = kineto.read(TRACES / rel).events
    sets = class_sets(ev)
    gpu = [rs for rs in sets.values() if rs.path == "gpu"]
    assert len(gpu) == 1, rel
    rs = gpu[0]
    busy = iv.union2(iv.union2(rs.compute, rs.comm), rs.memory)
    lo, hi = int(busy[0][0]), int(busy[1][-1])
    window = hi - lo
    assert window / 1e3 == pytest.approx(g["total_time_us"], abs=1.0)
    idle_pct = 100 * (window - iv.total(busy)) / window
    assert abs(idle_pct - g["idle_pct"]) <= TOL_PP, (idle_pct, g["idle_pct"])
    if g["computation_comparable"]:
        comp_pct = 100 * iv.total(rs.compute) / window
        assert abs(comp_pct - g["computation_pct"]) <= TOL_PP, (comp_pct, g["computation_pct"])
    assert np.isfinite(idle_pct)
