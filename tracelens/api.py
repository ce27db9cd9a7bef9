"""Notebook API: `run = tracelens.load(path)`; properties are computed on first use and cached.

DataFrames use Arrow-backed dtypes (`pd.ArrowDtype`), so strings stay dictionary-encoded and
nanosecond integers stay exact.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import pandas as pd
import pyarrow as pa


def _df(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(types_mapper=pd.ArrowDtype)


class Run:
    """One run (a folder of per-rank traces or a single trace) opened for analysis."""

    def __init__(self, path: str | Path, no_cache: bool = False, **options):
        from tracelens.run_analysis import Options, analyze_run

        self.path = Path(path)
        self._analysis = analyze_run(self.path, Options(no_cache=no_cache, **options))
        self._summary: dict | None = None

    def __repr__(self) -> str:
        a = self._analysis
        return f"<tracelens.Run {a.path} ranks={len(a.ranks)} events={a.events.num_rows:,}>"

    @property
    def analysis(self):
        """The underlying `tracelens.run_analysis.Analysis` (Arrow tables, analyzer results)."""
        return self._analysis

    @cached_property
    def events(self) -> pd.DataFrame:
        """Every complete event of every rank (schema: tracelens.schema.EVENTS)."""
        return _df(self._analysis.events)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Device events only (kernels, memcpy, memset), with their class (compute/communication/memory)."""
        from tracelens.analyze.classify import CLASS_NAMES, classify

        ev = self._analysis.events
        cls = classify(ev)
        kinds = ev.column("kind").cast(pa.string())
        mask = pa.compute.is_in(kinds, pa.array(["kernel", "gpu_memcpy", "gpu_memset"]))
        sub = ev.filter(mask)
        names = [CLASS_NAMES[int(c)] for c in cls[mask.to_numpy(zero_copy_only=False)]]
        sub = sub.append_column("class", pa.array(names, pa.string()).dictionary_encode())
        return _df(sub)

    @cached_property
    def memory(self) -> pd.DataFrame:
        """`[memory]` events: allocated and reserved bytes over time per rank."""
        return _df(self._analysis.run.memory)

    @cached_property
    def metadata(self) -> pd.DataFrame:
        """One row per rank: world size, host, GPU, process groups, file."""
        return _df(self._analysis.metadata)

    def breakdown(self) -> pd.DataFrame:
        """Per (rank, step): step time, compute, overlapped / exposed communication, memcpy, idle (ns)."""
        return _df(self._analysis.breakdown)

    def collectives(self) -> pd.DataFrame:
        """One row per (rank, collective instance): op, bytes, group, seq, start/end, wait vs transfer, busbw."""
        cross = self._analysis.cross
        if cross is None:
            return _df(self._nccl_only_collectives())
        return _df(cross.collectives)

    def _nccl_only_collectives(self) -> pa.Table:
        """Without Kineto traces: the rows of the NCCL logs and plugin dumps (rank null when unknown)."""
        from tracelens import schema

        tables = [t for k, t in self._analysis.nccl.items() if k in ("nccl_log", "nccl_plugin") and t.num_rows]
        if not tables:
            return schema.COLLECTIVES.empty_table()
        return pa.concat_tables(tables, promote_options="permissive").combine_chunks().unify_dictionaries()

    def arrival_lag(self) -> pd.DataFrame:
        """Rank x step table of how late each rank arrived at its collectives (ms; 0 = never the last)."""
        cross = self._analysis.cross
        if cross is None or cross.arrival_lag.num_rows == 0:
            return pd.DataFrame()
        df = cross.arrival_lag.to_pandas()
        return (
            df.pivot_table(index="rank", columns="step", values="lag_ns", aggfunc="sum") / 1e6
        ).rename_axis(index="rank", columns="step")

    def stragglers(self) -> pd.DataFrame:
        """Straggler verdicts (rank, cause, cost_ms, steps flagged, evidence); empty when there is none."""
        cross = self._analysis.cross
        rows = cross.stragglers if cross is not None else []
        return pd.DataFrame(
            rows, columns=["rank", "cause", "cost_ms", "steps_flagged", "steps_total", "score", "evidence"]
        )

    def bubbles(self) -> pd.DataFrame:
        """Per (rank, step): pipeline bubble (fill, drain, in-flight waits) in ns; empty without pipeline stages."""
        pipe = self._analysis.pipeline
        return _df(pipe.per_rank_step) if pipe is not None else pd.DataFrame()

    def stages(self) -> pd.DataFrame:
        """Per pipeline stage: ranks, layer types, compute, bubble fraction vs the schedule's expectation."""
        return pd.DataFrame(self.summary()["stages"])

    def findings(self) -> pd.DataFrame:
        """Every finding (code, severity, message, ranks, stages)."""
        return pd.DataFrame(
            self.summary()["findings"], columns=["code", "severity", "message", "ranks", "stages"]
        )

    def summary(self) -> dict:
        """The summary.json content (schema tracelens.summary/1); computed once."""
        if self._summary is None:
            self._summary = self._analysis.summary()
        return self._summary

    def to_arrow(self) -> dict[str, pa.Table]:
        """The raw Arrow tables: events, memory, metadata."""
        r = self._analysis.run
        return {"events": r.events, "memory": r.memory, "metadata": r.metadata}

    # ---- per-op view (docs/ops.md); `ranks=None`: one rank per stage, as in summary.json's `ops` ------
    def _ops_view(self, ranks=None):
        if ranks is None:
            view = self._analysis.ops_view
            if view is None:
                raise RuntimeError("the per-op view could not be built: see summary()['run']['warnings']")
            return view
        from tracelens.ops_view import ops_view

        return ops_view(self._analysis, list(ranks))

    def op_table(self, ranks=None) -> pd.DataFrame:
        """Ops by time per step: op, kernel, shapes, layer type, calls, ms per step, FLOPs, bytes, TFLOP/s,
        TB/s, roofline bound and % (tracelens.analyze.ops.OP_COLUMNS); `ranks`: which ranks (default one
        per stage)."""
        return self._ops_view(ranks).ops.copy()

    def kernel_table(self, ranks=None) -> pd.DataFrame:
        """Kernels (short names) by time per step, with the op that launches them most."""
        return self._ops_view(ranks).kernels.copy()

    def launch_stats(self, ranks=None) -> pd.DataFrame:
        """Per rank: kernel launch delay (CPU launch to GPU start) and the share of short kernels."""
        return self._ops_view(ranks).launches.copy()

    def memory_timeline(self) -> pd.DataFrame:
        """Allocator samples per rank: ts_ns, allocated and reserved bytes (from `[memory]` events)."""
        from tracelens.analyze.ops import memory_timeline

        return memory_timeline(self._analysis.run.memory)

    def memory_peaks(self) -> pd.DataFrame:
        """Per rank: peak allocated / reserved bytes, when, and the CPU op running at the peak."""
        from tracelens.report.html import _memory_peaks_of

        return _memory_peaks_of(self._analysis, self.summary())
