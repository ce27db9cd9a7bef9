"""What the report shows beyond summary.json: the pipeline timeline's blocks, the memory peaks and samples
and the top operations, read from the run's tables; the layout and the cross-rank and per-op results as the
analysis holds them. The report (`tracelens.report`) renders; this module reads for it, so that nothing under
`report/` imports an analyzer or reads events. `ReportViews` is what a report is given beside the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

#: The memory-over-time chart reads the samples of at most this many ranks (the first ones, and the ranks
#: it shows at first: `report.figures.memory_default_ranks`); its button draws all of these.
MEMORY_TIMELINE_RANKS = 16
#: Points per rank of the memory-over-time chart (`analyze.efficiency.ops.memory_timeline` thins to these).
MEMORY_TIMELINE_POINTS = 1500


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def top_operations_of_stages(ops: pa.Table | None, top: int = 15) -> tuple[str, list[dict[str, Any]]]:
    """`top_operations` from the per-rank stages' totals (`tracelens.store.stages.OPS` plus "rank"), so the
    report's top kernels (or CPU ops on a CPU-only run) need no pass over every event."""
    if ops is None or ops.num_rows == 0:
        return "", []
    for k in ("kernel", "cpu_op"):
        sel = ops.filter(pc.equal(ops.column("kind"), k))
        if sel.num_rows:
            break
    else:
        return "", []
    agg = sel.group_by("name", use_threads=False).aggregate([("dur_ns", "sum"), ("calls", "sum")])
    # (equal totals by name: the order does not hang on the group-by's)
    agg = agg.sort_by([("dur_ns_sum", "descending"), ("name", "ascending")]).slice(0, top)
    n_ranks = len(pc.unique(sel.column("rank")))
    return ("kernel" if k == "kernel" else "CPU op"), [
        {
            "name": r["name"],
            "calls": int(r["calls_sum"]),
            "total_ms": _r(r["dur_ns_sum"] / 1e6),
            "per_rank_ms": _r(r["dur_ns_sum"] / 1e6 / max(n_ranks, 1)),
        }
        for r in agg.to_pylist()
    ]


def rank_memory_peaks(memory: pa.Table | None) -> list[dict[str, Any]]:
    """Peak allocated and reserved bytes per rank: GPU devices when the trace has them, else the CPU (-1)."""
    if memory is None or memory.num_rows == 0:
        return []
    dev = memory.column("device").fill_null(-1)
    gpu = pc.greater_equal(dev, 0)
    t = memory.filter(gpu) if pc.any(gpu).as_py() else memory
    agg = (
        t.group_by("rank").aggregate([("total_allocated", "max"), ("total_reserved", "max")]).sort_by("rank")
    )
    return [
        {"rank": int(r["rank"]), "allocated": r["total_allocated_max"], "reserved": r["total_reserved_max"]}
        for r in agg.to_pylist()
    ]


def memory_peaks_of(analysis: Any, stage_of: dict[int, Any]) -> pd.DataFrame:
    """Per rank: peak allocated / reserved, and the CPU op running at the peak (`efficiency.ops.memory_peaks`).
    The op at the peak needs the rank's events: only those of the ranks the report shows (the first 16) and
    of each stage's highest peak are read (a large run's events are never all read for this)."""
    from tracelens.analyze.efficiency.ops import memory_peaks, uses_gpu_samples

    mem = analysis.run.memory if analysis is not None else None
    if mem is None or mem.num_rows == 0:
        return memory_peaks(mem)
    first = memory_peaks(mem, None, stage_of)
    want = set(first["rank"].head(16))
    if first["stage"].notna().any():
        top = first.dropna(subset=["stage"]).sort_values("peak_allocated", ascending=False)
        want |= set(top.drop_duplicates("stage")["rank"])
    cols = ["rank", "kind", "name", "ts_ns", "dur_ns"]  # (what memory_peaks reads of the events)
    ranks = sorted(int(r) for r in want)
    events = analysis.run.events_of(ranks, cols)
    # the op at the peak from these ranks' samples only (their peaks are the same in a table of their own
    # rows, as long as it keeps the same choice of GPU or CPU samples), not from every rank's again
    sub = mem.filter(pc.is_in(mem.column("rank"), value_set=pa.array(ranks, mem.column("rank").type)))
    if uses_gpu_samples(sub) != uses_gpu_samples(mem):
        return memory_peaks(mem, events, stage_of)
    at = memory_peaks(sub, events, stage_of)
    ops_at = dict(zip(at["rank"], at["op_at_peak"]))
    first["op_at_peak"] = [ops_at.get(int(r)) for r in first["rank"]]
    return first


def sampled_ranks(
    mem: pa.Table | None, n: int, also: Sequence[int]
) -> tuple[pa.Table | None, int, int | None]:
    """(The rows of `mem` that `ops.memory_timeline` plots, of the first `n` ranks that have such samples
    and of the ranks `also`, only; how many ranks have them; the first sample's time over all of them, or
    None): a large run's timeline is thinned for the ranks it shows only."""
    import numpy as np

    from tracelens.analyze.efficiency.ops import device_sample_mask

    if mem is None or mem.num_rows == 0:
        return mem, 0, None
    m = mem.filter(pa.array(device_sample_mask(mem)))
    ranks = np.unique(m.column("rank").to_numpy(zero_copy_only=False))
    t0 = pc.min(m.column("ts_ns")).as_py() if m.num_rows else None
    want = sorted({int(r) for r in ranks[:n]} | {int(r) for r in also})
    if ranks.size > len(want) or set(want) != {int(r) for r in ranks}:
        m = m.filter(pc.is_in(m.column("rank"), value_set=pa.array(want, m.column("rank").type)))
    return m, int(ranks.size), t0


class ReportViews:
    """What the report reads of an analysis (`run_analysis.Analysis`) beyond summary.json, each part computed
    when its section asks for it (a failure is that section's, under the report's error policy)."""

    def __init__(self, analysis: Any):
        self.analysis = analysis

    # what the report reads of the analysis' typed results, as they are (no events)
    @property
    def warnings(self) -> list[str]:
        """The analysis' warnings: a report section that fails adds its line here (tracelens.policy)."""
        out: list[str] = self.analysis.warnings
        return out

    @property
    def grid(self) -> Any:
        """The layout the findings use (`analyze.layout.Grid`), or None."""
        return self.analysis.grid

    @property
    def composition(self) -> Any:
        return self.analysis.composition

    @property
    def cross(self) -> Any:
        """The cross-rank result (`analyze.comm.stragglers.CrossRankResult`: matched collectives, clock offsets)."""
        return self.analysis.cross

    @property
    def ops_view(self) -> Any:
        return getattr(self.analysis, "ops_view", None)

    @property
    def nccl(self) -> dict[str, Any]:
        """The NCCL inputs read (Flight Recorder records, plugin and log tables) by kind."""
        out: dict[str, Any] = getattr(self.analysis, "nccl", None) or {}
        return out

    def has_memory(self) -> bool:
        mem = self.analysis.run.memory
        return mem is not None and mem.num_rows > 0

    def pipeline_blocks(
        self, chain: Sequence[int], stage_of: Mapping[int, int | None], step: int | None
    ) -> list[Any]:
        """`analyze.pipeline.timeline.pipeline_blocks` of the ranks `chain` (one per stage), aligned by the cross-rank
        clock offsets when known; [] when their events cannot be read."""
        from tracelens.analyze.pipeline.timeline import pipeline_blocks

        events = self.analysis.run.events_of(list(chain))
        if events is None:
            return []
        cross = self.analysis.cross
        return pipeline_blocks(events, list(chain), dict(stage_of), step, getattr(cross, "offsets_ns", None))

    def rank_memory_peaks(self) -> list[dict[str, Any]]:
        """Peak allocated and reserved bytes per rank (`rank_memory_peaks`): the memory bar's."""
        return rank_memory_peaks(self.analysis.run.memory)

    def memory_peaks(self, stage_of: dict[int, Any]) -> pd.DataFrame:
        return memory_peaks_of(self.analysis, stage_of)

    def memory_timeline(self, shown: Sequence[int]) -> tuple[pd.DataFrame, int, int | None]:
        """(The thinned memory samples of the first MEMORY_TIMELINE_RANKS ranks and of `shown`, how many ranks
        have samples, the first sample's time or None)."""
        from tracelens.analyze.efficiency.ops import memory_timeline

        mem, n_ranks, first_ts = sampled_ranks(self.analysis.run.memory, MEMORY_TIMELINE_RANKS, shown)
        return memory_timeline(mem, max_points=MEMORY_TIMELINE_POINTS), n_ranks, first_ts

    def top_operations(self) -> tuple[str, list[dict[str, Any]]]:
        """`top_operations_of_stages` of the run's per-rank op totals, kernel names shortened in `short`
        (`analyze.efficiency.ops.short_kernel_name`)."""
        from tracelens.analyze.efficiency.ops import short_kernel_name

        kind, rows = top_operations_of_stages(self.analysis.run.stages.ops)
        for r in rows:
            r["short"] = (short_kernel_name(r["name"]) or r["name"]) if kind == "kernel" else r["name"]
        return kind, rows


__all__ = [
    "MEMORY_TIMELINE_RANKS",
    "ReportViews",
    "memory_peaks_of",
    "rank_memory_peaks",
    "sampled_ranks",
    "top_operations_of_stages",
]
