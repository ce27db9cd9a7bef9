"""Run every analyzer on one run and hold the results: the one place that wires analyzers together.

The CLI, the notebook API and `summarize` all go through `analyze_run`, so they agree by construction.
Analyzers stay pure; this module decides what runs (given the options and what the traces hold).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import pyarrow as pa

from tracelens.engine import kept
from tracelens.errors import BadInputError, TracelensError
from tracelens.findings import finding
from tracelens.ingest.salvage import damaged_findings
from tracelens.options import Options
from tracelens.policy import contained

if TYPE_CHECKING:
    import pandas as pd

    from tracelens.analyze.comm.hang import HangResult
    from tracelens.analyze.comm.nccl_sources import NcclSourcesResult
    from tracelens.analyze.comm.p2p_hang import P2PHangResult
    from tracelens.analyze.comm.stragglers import CrossRankResult
    from tracelens.analyze.critical.critical_path import CriticalPath, Graph
    from tracelens.analyze.efficiency.kv_heads import KVWidths
    from tracelens.analyze.layout import Grid
    from tracelens.analyze.layout.roles import CollectiveRoles
    from tracelens.analyze.pipeline.composition import CompositionResult
    from tracelens.analyze.pipeline.layer_work import RankWork
    from tracelens.analyze.pipeline.pipeline import PipelineResult
    from tracelens.analyze.pipeline.prescribe import PipelineModel
    from tracelens.discover import TraceFile
    from tracelens.models.audit import AuditResult
    from tracelens.models.op_flops import OpContext
    from tracelens.models.spec import ModelSpec
    from tracelens.ops_view import OpsView
    from tracelens.result import Result
    from tracelens.run import Run
    from tracelens.schema import RankSets
    from tracelens.thresholds import Thresholds

T = TypeVar("T")


@dataclass
class Analysis:
    """Results of one run's analysis; heavy parts are computed on first access and cached."""

    path: Path
    options: Options
    run: Run  # tracelens.run.Run: metadata, files, per-rank stage results; events read lazily
    warnings: list[str] = field(default_factory=list)
    # MFU_IMPOSSIBLE, set when `mfu` is computed
    mfu_findings: list[dict[str, Any]] = field(default_factory=list)
    # cache files written in the background: (what they keep, done when they are written)
    _writes: list[tuple[str, Future[None]]] = field(default_factory=list, init=False, repr=False)
    _cross_key: str | None = field(default=None, init=False, repr=False)  # (store.results.cross_key)
    failures: int = field(default=0, init=False)  # optional parts that failed so far (warnings, `_guarded`)
    # what resolving group-local P2P peers did (analyze.layout.p2p.resolve_peers), set with `_xevents`
    p2p_peers: dict[str, int] = field(default_factory=dict, init=False)

    @cached_property
    def _xevents(self) -> pa.Table:
        """The events the cross-rank analyses read: the per-rank stages' few rows per rank, with the global
        peer of every send / receive that recorded only a group-local one (analyze.layout.p2p.resolve_peers)."""
        from tracelens.analyze.layout.p2p import resolve_peers

        x, self.p2p_peers = resolve_peers(self.run.stages.xevents, self.metadata)
        if self.p2p_peers["ambiguous"] or self.p2p_peers["unmapped"]:
            n = self.p2p_peers["ambiguous"] + self.p2p_peers["unmapped"]
            self.warnings.append(
                f"the peer of {n} point-to-point op(s) recorded only within its process group could not be "
                "mapped to a global rank (several groups fit equally well, or none)"
            )
        return x

    def _collectives(self) -> pa.Table:
        """The collectives of the cross-rank events (the run memo's), with the P2P peers resolved here."""
        st = self.run.stages
        if self._xevents is st.xevents:
            return kept.cross_collectives(st)
        from tracelens.analyze.layout.p2p import fill_collective_peers

        return fill_collective_peers(kept.cross_collectives(st), self._xevents)

    # ---- base tables -------------------------------------------------------------------------
    @property
    def events(self) -> pa.Table:
        """Every event of every rank (read from the cache on first use)."""
        return self.run.events

    @property
    def metadata(self) -> pa.Table:
        return self.run.metadata

    @property
    def sets(self) -> dict[int, RankSets]:
        return self.run.stages.sets

    @property
    def breakdown(self) -> pa.Table:
        """Per (rank, step) breakdown; a step that hung through point-to-point (P2P_HANG) is left out."""
        return self._without_hung_steps(self._raw_breakdown)

    def _without_hung_steps(self, t: pa.Table) -> pa.Table:
        """Rows of `t` (per rank and step) outside the steps that hung through point-to-point."""
        hung = self.p2p.hung_steps if self.p2p is not None and self.p2p.findings else []
        if not hung:
            return t
        import pyarrow.compute as pc

        keep = pc.invert(
            pc.fill_null(
                pc.is_in(t.column("step"), value_set=pa.array(hung, t.schema.field("step").type)), False
            )
        )
        return t.filter(keep)

    @cached_property
    def _cut_ranks(self) -> list[int]:
        """Ranks whose trace was cut mid-write (salvaged)."""
        md = self.metadata
        if md.num_rows == 0 or "salvaged" not in md.column_names:
            return []
        return [r["rank"] for r in md.select(["rank", "salvaged"]).to_pylist() if r["salvaged"]]

    def _without_cut_windows(self, t: pa.Table) -> pa.Table:
        """Rows of `t` less the whole-trace windows (step null) of cut traces: what is left of a cut trace
        is not a whole window (docs/bad-input.md); only its complete steps are analyzed."""
        cut = self._cut_ranks
        if not cut or t.num_rows == 0:
            return t
        import pyarrow.compute as pc

        drop = pc.and_(
            pc.is_null(t.column("step")),
            pc.fill_null(
                pc.is_in(t.column("rank"), value_set=pa.array(cut, t.schema.field("rank").type)), False
            ),
        )
        return t.filter(pc.invert(drop))

    @cached_property
    def _raw_breakdown(self) -> pa.Table:
        return self._without_cut_windows(self.run.stages.breakdown)

    @cached_property
    def p2p(self) -> P2PHangResult | None:
        """Hang through point-to-point (tracelens.analyze.comm.p2p_hang): hung steps, root rank, blocked chain."""
        if self._xevents.num_rows == 0:
            return None
        from tracelens.analyze.comm.p2p_hang import diagnose_p2p

        res = self._guarded(
            "p2p hang", lambda: diagnose_p2p(self._xevents, self._raw_breakdown, self.stage_of)
        )
        if res is not None and res.findings:
            self.warnings.append(
                f"step(s) {', '.join(map(str, res.hung_steps))} hung (P2P_HANG): left out of the performance "
                "analysis"
            )
        return res

    @cached_property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.metadata.column("rank").to_pylist())

    @cached_property
    def world_size(self) -> int | None:
        ws = [w for w in self.metadata.column("world_size").to_pylist() if w]
        return int(max(ws)) if ws else None

    @cached_property
    def steps(self) -> list[int]:
        return sorted({s for s in self.breakdown.column("step").to_pylist() if s is not None})

    @cached_property
    def gpu_name(self) -> str | None:
        if self.options.gpu:
            return self.options.gpu
        names = [n for n in self.metadata.column("gpu_name").to_pylist() if n]
        return names[0] if names else None

    # ---- model and MFU -------------------------------------------------------------------------
    @cached_property
    def model(self) -> ModelSpec | None:
        """ModelSpec from --model / tracelens.toml, else None."""
        if not self.options.model:
            return None
        from tracelens.models import get_model

        model = self.options.model
        if self.path.is_dir() and (self.path / model).is_file():
            model = str(self.path / model)
        return get_model(model)

    @cached_property
    def step_times_s(self) -> dict[int, float]:
        """Per step: the longest rank's step time in seconds (the step ends when the last rank ends)."""
        out: dict[int, float] = {}
        for row in self.breakdown.select(["step", "step_time_ns"]).to_pylist():
            if row["step"] is None:
                continue
            out[row["step"]] = max(out.get(row["step"], 0.0), row["step_time_ns"] / 1e9)
        return out

    @cached_property
    def peak_flops(self) -> float | None:
        if self.options.peak_tflops:
            return float(self.options.peak_tflops) * 1e12
        from tracelens.models.hardware import peak_flops

        return peak_flops(self.gpu_name)

    @cached_property
    def mfu(self) -> dict[str, Any] | None:
        """The summary's "mfu" object, or None when the model is unknown."""
        if self.model is None:
            return None
        from tracelens.analyze.efficiency.mfu import compute_mfu

        seq = self.options.seq_len
        tokens = seq * self.options.global_batch if seq and self.options.global_batch else None
        steps = self.step_times_s
        mean_step = float(np.mean(list(steps.values()))) if steps else None
        raw = compute_mfu(
            self.model,
            seq,
            tokens,
            mean_step,
            self.world_size or len(self.ranks),
            self.peak_flops,
            step_times_s=steps or None,
            lost_time_s=self.lost_time_s(),
        )
        return self._mfu_guarded(raw)

    def _mfu_guarded(self, raw: dict[str, Any]) -> dict[str, Any] | None:
        """Null an impossible MFU (> 100%) and keep its MFU_IMPOSSIBLE finding (analyze/efficiency/mfu_checks.py)."""
        from tracelens.analyze.efficiency.mfu_checks import impossible_mfu

        mfu, self.mfu_findings = impossible_mfu(raw, self.options.global_batch)
        return mfu

    @cached_property
    def mfu_warnings(self) -> list[str]:
        """The batch options against what the trace shows (microbatches x dp), analyze/efficiency/mfu_checks.py."""
        from tracelens.analyze.efficiency.mfu_checks import trace_conflicts

        pipe = self.pipeline
        observed = getattr(pipe, "microbatches_observed", None) if pipe is not None else None
        return trace_conflicts(self.options.global_batch, self.options.microbatches, observed, self.grid.dp)

    def lost_time_s(self) -> dict[str, float] | None:
        """Mean over (rank, step) of the bubble and of the exposed communication beyond it, in seconds.

        Pipeline waits happen inside P2P receive kernels, so they are both bubble and exposed communication;
        counting them once keeps "MFU without bubbles and exposed communication" honest.
        """
        bd = self.breakdown
        if bd.num_rows == 0:
            return None
        bubble = {}
        if self.bubble_per_rank_step is not None:
            for r in self.bubble_per_rank_step.select(["rank", "step", "bubble_ns"]).to_pylist():
                bubble[(r["rank"], r["step"])] = r["bubble_ns"]
        exposed, bubbles = [], []
        for r in bd.select(["rank", "step", "exposed_comm_ns"]).to_pylist():
            b = bubble.get((r["rank"], r["step"]), 0)
            bubbles.append(b)
            exposed.append(r["exposed_comm_ns"] - min(b, r["exposed_comm_ns"]))
        out = {"exposed_comm": float(np.mean(exposed)) / 1e9}
        if bubble:
            out["bubble"] = float(np.mean(bubbles)) / 1e9
        return out

    @cached_property
    def bubble_per_rank_step(self) -> pa.Table | None:
        return self.pipeline.per_rank_step if self.pipeline is not None else None

    # ---- optional analyzers: a failure becomes a warning (tracelens.policy) ---------------------
    def _guarded(self, what: str, fn: Callable[[], T]) -> T | None:
        n = len(self.warnings)
        out = contained(f"{what} skipped", fn, self.warnings)
        self.failures += len(self.warnings) > n
        return out

    @cached_property
    def _grid_and_findings(self) -> tuple[Grid, list[dict[str, Any]]]:
        from tracelens.analyze.layout import grid_for_run, parse_layout

        layout = parse_layout(self.options.layout) if self.options.layout else None
        fr = self.nccl.get("flight_recorder") if self._xevents.num_rows else None  # group traffic (gloo)
        return grid_for_run(
            self._xevents,
            self.metadata,
            layout,
            self.options.order,
            force=self.options.force_layout,
            collectives=fr,
            pg=kept.grid_rows(self.run.stages),  # (the run memo's: the events' groups not counted again)
            roles=self.collective_roles,
            thresholds=self.thresholds,
        )

    @cached_property
    def collective_roles(self) -> CollectiveRoles | None:
        """What each collective does, from the shapes of its c10d op (analyze.layout.roles), when the traces
        do not say which process group ran it (gloo; traces without record_param_comms) and the run has at
        most ROLES_MAX_RANKS ranks (each rank's trace is decoded again for the shapes); else None."""
        from tracelens.analyze.layout.roles import ROLES_MAX_RANKS, collective_roles

        if self._xevents.num_rows == 0 or len(self.ranks) > ROLES_MAX_RANKS:
            return None
        coll = self._collectives()
        if coll.num_rows == 0:
            return None
        import pyarrow.compute as pc

        unnamed = pc.and_(
            pc.invert(pc.fill_null(coll.column("is_p2p"), False)),
            pc.and_(coll.column("pg_ranks").is_null(), coll.column("pg_name").is_null()),
        )
        if not pc.any(unnamed).as_py():
            return None
        from tracelens.ingest.op_shapes import read as read_shapes

        paths = dict(zip(self.metadata.column("rank").to_pylist(), self.metadata.column("path").to_pylist()))
        return self._guarded(
            "collective roles",
            lambda: collective_roles(
                coll, self._xevents, lambda r: read_shapes(paths[r]) if paths.get(r) else None
            ),
        )

    @property
    def grid(self) -> Grid:
        """Rank grid (tracelens.analyze.layout.Grid): from --layout / tracelens.toml, else inferred."""
        return self._grid_and_findings[0]

    @cached_property
    def stage_of(self) -> dict[int, int] | None:
        g = self.grid
        if not g.pp:
            return None
        # (a grid with pp places every rank of the run; a rank it cannot place maps to None, as before)
        return cast("dict[int, int]", {r: g.stage_of(r) for r in self.ranks})

    @cached_property
    def cross(self) -> CrossRankResult | None:
        """Collectives, clock offsets, wait vs transfer and stragglers (tracelens.analyze.comm.stragglers)."""
        if self._xevents.num_rows == 0:
            return None
        return self._guarded("cross-rank analysis", self._cross)

    def _cross(self) -> CrossRankResult:
        from tracelens.analyze.comm.stragglers import StragglerConfig, analyze_cross_rank
        from tracelens.store import results

        st = self.run.stages
        stage_of, breakdown = self.stage_of, self.breakdown
        key = (
            results.cross_key(st.memo_id, self.metadata, breakdown, stage_of, self.thresholds.changed())
            if st.memo is not None
            else None
        )
        res = kept.read_cross(st.memo, key) if st.memo is not None and key else None
        if res is None:
            res = analyze_cross_rank(
                self._xevents,
                self.metadata,
                breakdown,
                stage_of=stage_of,
                sets=self.sets,
                collectives=self._collectives(),  # (the run memo's: not recomputed)
                config=StragglerConfig.of(self.thresholds),
            )
            if st.memo is not None and key:  # (written while the analysis goes on)
                self.keep_writing("the cross-rank analysis", kept.write_cross_later(st.memo, key, res))
        self._cross_key = key
        if self.layer_work:  # ranks without stage peers: their work per layer against the other stages'
            from tracelens.analyze.comm.stragglers import with_layer_work

            res = with_layer_work(
                res, self.layer_work, self.stage_of or {}, self.breakdown, self.thresholds.layer_work_excess
            )
        return res

    def op_shapes(self, rank: int) -> pa.Table | None:
        """The recorded op shapes of one rank's trace (ingest.op_shapes), read once per analysis."""
        memo = self.__dict__.setdefault("_op_shapes", {})
        if rank not in memo:
            from tracelens.ingest.op_shapes import read as read_shapes
            from tracelens.ops_view import _paths

            paths = self.__dict__.setdefault("_trace_paths", _paths(self))
            memo[rank] = read_shapes(paths[rank]) if rank in paths else None
        out: pa.Table | None = memo[rank]
        return out

    @cached_property
    def layer_work(self) -> dict[int, RankWork]:
        """Layers and matmul work per layer of each rank (analyze.pipeline.layer_work) in a pipeline of at most
        ROLES_MAX_RANKS ranks analysed on the CPU timeline: the layer census where module annotations are
        missing or partial, and the work per layer of ranks no data-parallel replica shares a stage with.
        Empty when not applicable."""
        from tracelens.analyze.layout.roles import ROLES_MAX_RANKS

        g = self.grid
        if not g.pp or g.pp < 2 or len(self.ranks) > ROLES_MAX_RANKS or self._xevents.num_rows == 0:
            return {}
        cpu = [r for r, rs in self.sets.items() if getattr(rs, "path", None) == "cpu"]
        if not cpu:
            return {}
        return self._guarded("layer census", lambda: self._layer_work(sorted(cpu))) or {}

    def _layer_work(self, ranks: list[int]) -> dict[int, RankWork]:
        import pyarrow.compute as pc

        from tracelens.analyze.pipeline.layer_work import rank_work
        from tracelens.analyze.pipeline.pipeline import observed_microbatches

        m = self.options.microbatches or observed_microbatches(self._xevents, self.grid, self.spans)
        if not m:
            return {}
        stage_of = self.stage_of or {}
        alone = {r for r in ranks if sum(1 for q in stage_of if stage_of[q] == stage_of.get(r)) == 1}
        out = {}
        x = self._xevents
        for r in ranks:
            ev = x.filter(pc.equal(x.column("rank"), r))
            w = rank_work(r, ev, self.op_shapes(r) if r in alone else None, m, None)
            if w is not None:
                out[r] = w
        return out

    @cached_property
    def spans(self) -> pa.Table | None:
        """Module annotation spans (layers.N.<type>) shared by the pipeline and composition analyses."""

        if self._xevents.num_rows == 0:
            return None
        if self.options.layer_pattern:  # a user rule: the per-rank spans used the built-in rules only
            from tracelens.analyze.pipeline.composition import module_spans
            from tracelens.analyze.pipeline.layers import compile_rules, patterns

            compile_rules(self.options.layer_pattern)  # a bad pattern is the user's error (exit 2)
            pats = patterns(self.options.layer_pattern)
            return self._guarded(
                "module annotations", lambda: module_spans(self.events, pats, sets=self.sets)
            )
        return self._guarded("module annotations", self._staged_spans)

    def _staged_spans(self) -> pa.Table:
        st = self.run.stages
        if st.spans_error:
            raise RuntimeError(st.spans_error)
        return st.spans

    @cached_property
    def pipeline(self) -> PipelineResult | None:
        """Bubbles per stage (tracelens.analyze.pipeline.pipeline), when the run has more than one stage."""
        g = self.grid
        if not g.pp or g.pp < 2 or self._xevents.num_rows == 0:
            return None
        from tracelens.analyze.pipeline.pipeline import analyze_pipeline

        offsets = self.cross.offsets_ns if self.cross is not None else None
        return self._guarded(
            "pipeline analysis",
            lambda: analyze_pipeline(
                self._xevents,
                g,
                breakdown=self.breakdown,
                microbatches=self.options.microbatches,
                schedule=self.options.schedule,
                spans=self.spans,
                clock_offsets_ns=offsets,
                sets=self.sets,
                virtual_stages=self.options.virtual_stages,
                excess_threshold=self.thresholds.bubble_excess,
            ),
        )

    @cached_property
    def pipeline_model(self) -> PipelineModel | None:
        """The pipeline's measured work per stage and microbatch, for the schedule and layout what-ifs
        (tracelens.analyze.pipeline.prescribe); None without a recognised schedule or microbatch count."""
        pipe = self.pipeline
        if pipe is None or not pipe.schedule or not pipe.microbatches or not self.stage_of:
            return None
        return self._guarded("schedule what-if", lambda: self._pipeline_model(pipe))

    def _pipeline_model(self, pipe: PipelineResult) -> PipelineModel | None:
        from tracelens.analyze.pipeline.prescribe import measure

        cross, comp = self.cross, self.composition
        coll = None
        if cross is not None and cross.collectives.num_rows:
            t = cross.collectives
            coll = t.select(
                [c for c in ("rank", "peer", "op", "is_p2p", "transfer_ns") if c in t.column_names]
            )
            coll = coll.to_pandas()
        spans = (
            self.spans.select(["rank", "backward", "compute_ns"]).to_pandas()
            if self.spans is not None
            else None
        )
        steps = self.step_times_s
        memory = self._guarded("memory events", lambda: self.run.memory)
        pp = self.grid.pp
        if not pp:
            return None
        return measure(
            schedule=pipe.schedule,
            p=int(pp),
            v=int(pipe.virtual_stages or 1),
            m=pipe.microbatches,
            chains=self.grid.pipelines(),
            stage_of=self.stage_of or {},
            per_rank_step=pipe.per_rank_step.to_pandas(),
            rank_windows=pipe.rank_windows,
            spans=spans,
            collectives=coll,
            compute_sets=self.sets,
            layers=comp.stages if comp is not None else None,
            type_ms=comp.per_stage_type_ms if comp is not None else None,
            step_ns=float(np.mean(list(steps.values()))) * 1e9 if steps else 0.0,
            orders=pipe.orders,
            memory=memory,
        )

    def schedule_what_if(self) -> list[dict[str, Any]]:
        """Schedule and layout what-if entries (summary `what_if`, kind schedule | layout)."""
        pm = self.pipeline_model
        model, comp = self.model, self.composition
        if pm is None:
            if model is None:
                return []
            from tracelens.analyze.pipeline.prescribe import tp_entry_unreplayed

            got = self._guarded(
                "layout what-if",
                lambda: tp_entry_unreplayed(model, self.grid.tp, self.grid.pp, self.options.seq_len),
            )
            return [got] if got else []
        from tracelens.analyze.pipeline.prescribe import tp_layout, what_ifs

        def entries() -> list[dict[str, Any]]:
            opt = tp_layout(pm, model, self.grid.tp, self.options.seq_len) if model is not None else None
            return what_ifs(
                pm,
                layer_types=list(model.layer_types) if model is not None else None,
                block_size=model.block_size if model is not None else 1,
                layer_split=list(comp.layer_split) if comp is not None and comp.layer_split else None,
                tp=self.grid.tp,
                tp_option=opt,
            )

        return self._guarded("schedule what-if", entries) or []

    @cached_property
    def composition(self) -> CompositionResult | None:
        """Layer types per stage and time share per layer type (tracelens.analyze.pipeline.composition)."""
        if self._xevents.num_rows == 0 or not self.grid.pp:
            return None
        from tracelens.analyze.pipeline.composition import analyze_composition

        res = self._guarded(
            "stage composition",
            lambda: analyze_composition(
                self._xevents,
                self.grid,
                model=self.model,
                seq_len=self.options.seq_len,
                microbatches=(self.pipeline.microbatches if self.pipeline else self.options.microbatches),
                breakdown=self.breakdown,
                spans=self.spans,
                sets=self.sets,
                stage_ops=self.time_shared_stage_ops,
                imbalance_threshold=self.thresholds.stage_imbalance,
                census=self.layer_census,
            ),
        )
        if res is not None and res.source == "annotations":
            res.rule = self.layer_rule()
        return res

    @cached_property
    def thresholds(self) -> Thresholds:
        """The verdict thresholds of this analysis (tracelens.thresholds; [thresholds] in tracelens.toml)."""
        return self.options.verdict_thresholds

    @cached_property
    def layer_census(self) -> dict[int, dict[str, int]] | None:
        """Layers per stage counted from the ops (analyze.pipeline.layer_work.stage_layers), None without a census."""
        if not self.layer_work or not self.stage_of:
            return None
        from tracelens.analyze.pipeline.layer_work import stage_layers

        return stage_layers(self.layer_work, {r: s for r, s in self.stage_of.items() if s is not None})

    @cached_property
    def time_shared(self) -> set[int]:
        """CPU-timeline ranks that share a host's CPUs with other ranks (tracelens.analyze.rank.cpu_evidence)."""
        from tracelens.analyze.rank.cpu_evidence import shared_host_ranks

        return shared_host_ranks(self.metadata, self.sets)

    @cached_property
    def time_shared_stage_ops(self) -> dict[int, float] | None:
        """Compute ops per step per stage when every rank time-shares a host's CPUs, else None."""
        if not self.time_shared or self.time_shared != set(self.ranks) or not self.stage_of:
            return None
        from tracelens.analyze.rank.cpu_evidence import per_rank_step

        d = per_rank_step(self._xevents, self.time_shared)
        if d.empty:
            return None
        d["stage"] = d["rank"].map(self.stage_of)
        return {
            int(k): float(v) for k, v in d.dropna(subset=["stage"]).groupby("stage")["ops"].mean().items()
        }

    def straggler_stage_filter(self, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A stage whose extra work is a straggler's, found by its work per layer (analyze.pipeline.layer_work), is not
        a heavy stage unless it also holds more layers than the mean: its STAGE_IMBALANCE is dropped (the
        STRAGGLER finding names the cause)."""
        census = self.layer_census
        if not census or self.cross is None:
            return findings
        by_work = {
            s.get("stage")
            for s in self.cross.stragglers
            if s.get("cause") == "compute" and s["evidence"].get("work_per_layer_ratio")
        }
        mean = float(np.mean([sum(c.values()) for c in census.values()]))
        explained = {st for st in by_work if st is not None and sum(census.get(st, {}).values()) <= mean}
        return [
            f
            for f in findings
            if not (f["code"] == "STAGE_IMBALANCE" and set(f.get("stages") or ()) & explained)
        ]

    def time_shared_filter(self, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """On ranks that time-share a host's CPUs, waits include descheduling: bubble excess and exposed
        communication are not judged."""
        if not self.time_shared_stage_ops:
            return findings
        kept = [f for f in findings if f["code"] not in ("PIPELINE_BUBBLE_EXCESS", "EXPOSED_COMM_HIGH")]
        if len(kept) < len(findings):
            self.warnings.append(
                "all ranks time-share their host's CPUs: waits include descheduling, so bubble excess and exposed "
                "communication are not judged; stage work is compared by compute-op counts"
            )
        return kept

    @cached_property
    def idle(self) -> pd.DataFrame | None:
        """Per (rank, step) GPU idle split by cause (tracelens.analyze.rank.idle), GPU ranks only: the per-rank
        stages' rows (`idle_breakdown` per rank), less the steps left out of `breakdown`."""
        if not any(getattr(s, "path", None) == "gpu" for s in self.sets.values()):
            return None
        from tracelens.analyze.rank.idle import idle_frame
        from tracelens.policy import strict
        from tracelens.schema import IDLE

        st = self.run.stages
        table = self._without_hung_steps(
            self._without_cut_windows(st.idle if st.idle is not None else IDLE.empty_table())
        )
        if st.idle_error:  # the warning (or, strict, the error) of idle_breakdown over all ranks
            if strict():
                raise RuntimeError(st.idle_error)
            self.warnings.append(f"idle breakdown skipped: {st.idle_error}")
            return None
        return self._guarded("idle breakdown", lambda: idle_frame(table))

    @cached_property
    def inference(self) -> dict[str, Any] | None:
        """Inference iterations and their per-phase figures (tracelens.analyze.efficiency.inference); None when no rank's
        trace has engine iterations."""
        if (
            "iterations_json" not in self.metadata.column_names
            or self.metadata.column("iterations_json").null_count == self.metadata.num_rows
        ):
            return None
        from tracelens.analyze.efficiency.inference import inference_summary

        return self._guarded(
            "inference iterations", lambda: inference_summary(self.metadata, self.breakdown, self.idle)
        )

    @cached_property
    def iteration_contexts(self) -> dict[tuple[int, int], OpContext]:
        """(rank, step) -> the OpContext of that step's engine iteration (attention sums), for the op table."""
        if "iterations_json" not in self.metadata.column_names:
            return {}
        from tracelens.analyze.efficiency.inference import op_contexts

        return op_contexts(self.metadata)

    def idle_findings(self) -> list[dict[str, Any]]:
        from tracelens.analyze.rank.idle import idle_findings

        return idle_findings(self.idle, self.thresholds.gpu_idle) if self.idle is not None else []

    def layer_rule(self) -> str | None:
        """The layer-annotation rule (tracelens.analyze.pipeline.layers) that matched the run's span names."""
        from tracelens.analyze.pipeline.layers import matched_rule

        names = self._xevents.column("name").unique().to_pylist()
        ops = self.run.stages.ops
        if ops is not None:
            names += ops.column("name").to_pylist()
        rule: str | None = matched_rule((str(n) for n in names if n), self.options.layer_pattern)["rule"]
        return rule

    # ---- critical path and what-if (tracelens.analyze.critical.critical_path, .whatif) ---------------------
    @cached_property
    def critical(self) -> CriticalPath | None:
        """Cross-rank dependency graph, its replay and the critical path per step (None without device work)."""
        if self._xevents.num_rows == 0 or len(self.ranks) < 1:
            return None
        return self._guarded("critical path", self._critical)

    def _critical(self) -> CriticalPath | None:
        from tracelens.analyze.critical import critical_path as cp

        st = self.run.stages
        cross = self.cross
        stage_of = self.stage_of
        st.release_pages()  # (the graph's build, the analysis' memory peak, reads no event)
        key = self._graph_key(cross, stage_of)
        g = kept.read_graph(st.memo, key) if st.memo is not None and key else None
        try:
            if g is None:
                g = self._build_graph(cross, stage_of)
                if g is not None and st.memo is not None and key:  # (written while the graph is replayed)
                    done = kept.write_graph_later(st.memo, key, g, cp.plan_of(g))
                    self.keep_writing("the critical path's graph", done)
            if g is None:
                return None
            if g.dropped_instances:
                self.warnings.append(
                    f"critical path: {g.dropped_instances} collective instances left out as "
                    "rendezvous (matched in an order the ranks' stream order contradicts; their kernels "
                    "count as plain stream work)"
                )
            return cp.critical_path_of(g)
        except cp.GraphCycleError as err:  # not a bug in the input: matched instances the streams contradict
            self.warnings.append(
                f"critical path and what-if left out: {err} (collective instances matched in an order the "
                "ranks' stream order contradicts)"
            )
            return None

    def _build_graph(self, cross: CrossRankResult | None, stage_of: dict[int, int] | None) -> Graph | None:
        from tracelens.analyze.critical import critical_path as cp
        from tracelens.analyze.critical.critical_nodes import relabel, select_nodes
        from tracelens.store import pages

        # the per-rank stage computed the nodes (labelled with the built-in layer rules) and sync calls
        st = self.run.stages
        all_nodes, syncs = st.critical_inputs()
        nodes = select_nodes(all_nodes, st.nodes_stepped, self.ranks)
        del all_nodes
        if self.options.layer_pattern or st.spans_error:  # labels from the spans this analysis uses
            nodes = relabel(nodes, self.spans)
        return cp.build_graph(
            nodes,
            cross.collectives if cross is not None else None,
            cross.offsets_ns if cross is not None else None,
            stage_of,
            syncs,
            nodes_read=lambda: pages.release(nodes),  # (memory-mapped from the run memo: give it back)
        )

    def _graph_key(self, cross: CrossRankResult | None, stage_of: dict[int, int] | None) -> str | None:
        """Key of the graph `_build_graph` gives, kept in the run memo (`engine.kept.read_graph`): the memo's
        tables and every other input of the build (None: the stages are not a memo's)."""
        st = self.run.stages
        if st.memo is None:
            return None
        from tracelens.analyze.critical.critical_keys import COLL_COLUMNS
        from tracelens.store import runs
        from tracelens.store.arrays import table_digest

        def pairs(d: dict[int, int] | None) -> str:
            return json.dumps(None if d is None else sorted((int(k), int(v)) for k, v in d.items()))

        if cross is not None and self._cross_key:  # (the key of all the cross-rank result holds)
            of_cross = f"cross {self._cross_key}"
        else:
            coll = cross.collectives if cross is not None else None
            of_cross = pairs(cross.offsets_ns if cross is not None else None) + table_digest(
                None if coll is None else coll.select([c for c in COLL_COLUMNS if c in coll.column_names])
            )
        return runs.graph_key(
            st.memo_id,
            json.dumps([int(r) for r in self.ranks]),
            json.dumps([self.options.layer_pattern, st.spans_error]),
            pairs(stage_of),
            of_cross,
        )

    @cached_property
    def what_if_inputs(self) -> dict[str, Any]:
        """What `analyze.critical.whatif.what_if` reads beside the critical path and the findings (and its key)."""
        from tracelens.analyze.critical.whatif import per_layer_ns

        comp = self.composition
        layer_ns = None
        if comp is not None and comp.layer_split:
            m = self.pipeline.microbatches if self.pipeline is not None else self.options.microbatches
            layer_ns = per_layer_ns(comp.per_stage_type_ms, list(comp.layer_split), m)
        return {
            "peers_of": self.cross.peers if self.cross is not None else None,
            "stage_of": self.stage_of,
            "heavy_stage": comp.heavy_stage if comp is not None else None,
            "layer_split": comp.layer_split if comp is not None else None,
            "suggested_split": comp.suggested_split if comp is not None else None,
            "layer_ns": layer_ns,
        }

    def what_if(self, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The summary's `what_if` list; sets `saving_ms` on the findings it has a fix for."""
        crit = self.critical
        if crit is None:
            return []
        from tracelens.analyze.critical.whatif import what_if

        inputs = self.what_if_inputs
        self.run.stages.release_pages()  # (the replays read no event)
        return self._guarded("what-if", lambda: what_if(crit, findings, **inputs)) or []

    def what_if_key(self, findings: list[dict[str, Any]]) -> tuple[Path, str] | None:
        """Where the run memo keeps the critical path's part of summary.json and the what-if computed from
        these findings (`store.results.read_tail`), and its key; None without a memo or with inputs it
        cannot key."""
        st = self.run.stages
        if st.memo is None or self._xevents.num_rows == 0:
            return None
        from tracelens.store import results

        graph = self._graph_key(self.cross, self.stage_of)
        key = results.tail_key(graph, {"findings": findings, **self.what_if_inputs}) if graph else None
        return (st.memo, key) if key else None

    @cached_property
    def layer_composition(self) -> CompositionResult | None:
        """Layer types and time share per layer type for `compare`: `composition`, or on a run without
        pipeline stages the same analysis over the whole run (None when it cannot run: a warning)."""
        if self.composition is not None or self._xevents.num_rows == 0:
            return self.composition
        from tracelens.analyze.pipeline.composition import analyze_composition

        return self._guarded(
            "layer composition",
            lambda: analyze_composition(
                self._xevents, self.grid, breakdown=self.breakdown, spans=self.spans, sets=self.sets
            ),
        )

    def audit(self, existing: list[dict[str, Any]]) -> tuple[AuditResult | None, list[dict[str, Any]]]:
        """Layout audit of the model on this run's grid: (AuditResult or None, new findings)."""
        if self.model is None:
            return None, []
        from tracelens.analyze.pipeline.composition import audit_for_run

        split = self.composition.layer_split if self.composition is not None else None
        audit, found = audit_for_run(self.grid, self.model, self.options.seq_len, split, existing)
        return audit, self._with_kv_evidence(found, existing)

    @cached_property
    def kv_widths(self) -> KVWidths | None:
        """The K/V projection widths one tensor-parallel rank computes (analyze.efficiency.kv_heads), read from its
        annotated projections and matmul shapes; None without tensor parallelism or without them."""
        if not self.grid.tp or self.grid.tp < 2 or not self.ranks:
            return None
        from tracelens.analyze.efficiency.kv_heads import projection_widths
        from tracelens.ops_view import _shapes

        r = min(self.ranks)
        return self._guarded(
            "K/V projection widths",
            lambda: projection_widths(r, self.run.events_of([r]), _shapes(self, [r])),
        )

    def _with_kv_evidence(
        self, found: list[dict[str, Any]], existing: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """KV_HEAD_REPLICATION with what the trace shows (analyze.efficiency.kv_heads): the audit's finding gains the
        measured widths; a replication the trace shows and the audit did not predict is reported from the
        trace alone."""
        m, tp = self.model, self.grid.tp
        w = self.kv_widths
        if m is None or not tp or w is None:
            return found
        from tracelens.analyze.efficiency.kv_heads import kv_evidence
        from tracelens.findings import finding

        ev = kv_evidence(w, m.num_attention_heads, m.num_key_value_heads, m.head_dim, tp, m.hidden_size)
        if ev is None:
            return found
        seen = (
            f"the trace shows rank {ev['rank']}'s K/V projections {ev['kv_width']} features wide where the exact "
            f"split of {m.num_key_value_heads} KV heads x {m.head_dim} over tp={tp} is {ev['exact_width']:g}"
            + (
                f" ({ev['extra_kv_weight_elements_per_layer']:,.0f} extra K/V weights and "
                f"{ev['extra_kv_activation_elements_per_token_per_layer']:,.0f} extra K/V activations per token "
                "per attention layer on every rank)"
                if ev["factor"] > 1
                else ""
            )
        )
        out = []
        for f in found:
            if f["code"] == "KV_HEAD_REPLICATION":
                f = {**f, "message": f"{f['message']}; {seen} ({ev['factor']:.2g}x)", "trace_evidence": ev}
            out.append(f)
        codes = {f["code"] for f in out} | {f["code"] for f in existing}
        if ev["factor"] > 1 + 1e-9 and "KV_HEAD_REPLICATION" not in codes:
            out.append(
                finding(
                    "KV_HEAD_REPLICATION",
                    "warning",
                    f"{seen}: each rank computes {ev['factor']:.2g}x its share of K and V (replicated heads)",
                    factor=ev["factor"],
                    trace_evidence=ev,
                )
            )
        return out

    @cached_property
    def sized_collectives(self) -> pd.DataFrame | None:
        """cross.collectives (DataFrame of the columns its readers use: `comm_by_type`, the summary's
        collectives); gloo sizes the trace lacks filled from the Flight Recorder (comm_by_layer.py)."""
        if self.cross is None or self.cross.collectives.num_rows == 0:
            return None
        from tracelens.analyze.comm.comm_by_layer import SIZED_COLUMNS, sizes_from_flight_recorder

        t = self.cross.collectives
        df = t.select([c for c in t.column_names if c in SIZED_COLUMNS]).to_pandas()
        return self._guarded(
            "collective sizes", lambda: sizes_from_flight_recorder(df, self.nccl.get("flight_recorder"))
        )

    @cached_property
    def comm_by_type(self) -> dict[str, Any] | None:
        """Communication per layer type ({type: {op: calls/bytes/ms per step}}, analyze/comm/comm_by_layer.py)."""
        if self.sized_collectives is None or self.spans is None:
            return None
        from tracelens.analyze.comm.comm_by_layer import comm_by_layer_type

        n = len(self.steps) or 1
        return self._guarded(
            "communication per layer type",
            lambda: comm_by_layer_type(self.sized_collectives, self.spans, {r: n for r in self.ranks}),
        )

    # ---- NCCL inputs (Flight Recorder, profiler plugin, NCCL logs) ------------------------------
    @cached_property
    def nccl(self) -> dict[str, pa.Table]:
        """Collectives tables from the non-Kineto inputs found in the run folder, by source."""
        from tracelens.ingest import flight_recorder, nccl_log, nccl_plugin
        from tracelens.ingest.sniff import NCCL_LOG, NCCL_PLUGIN

        files = self.run.files
        out: dict[str, pa.Table] = {}

        def usable(paths: list[Path], read: Callable[[Path], object]) -> list[Path]:
            """The files `read` accepts; an unreadable one (a dump cut mid-write) is a warning, not fatal."""
            ok = []
            for p in paths:
                try:
                    read(p)
                    ok.append(p)
                except TracelensError as err:
                    self.warnings.append(f"skipped {err}")
            return ok

        fr = self._flight_recorder_dumps(files, usable)
        if fr:
            out["flight_recorder"] = flight_recorder.read_many(fr)
        plugin = usable([f.path for f in files if f.fmt == NCCL_PLUGIN], nccl_plugin.read)
        self.warnings.extend(n for n in map(nccl_plugin.cut_note, plugin) if n)  # (a file cut: what was lost)
        if plugin:
            t = nccl_plugin.read_many(plugin)
            # each rank's plugin times against its own Kineto collectives (one host, one clock; the cross-rank
            # analysis is not needed, and it needs the layout, which reads the NCCL inputs: a cycle)
            ref = kept.cross_collectives(self.run.stages) if self._xevents.num_rows else None
            if ref is not None and ref.num_rows:
                t = nccl_plugin.align(t, ref)
            else:
                t = nccl_plugin.align_ranks(t)
            out["nccl_plugin"] = t
        logs = usable([f.path for f in files if f.fmt == NCCL_LOG], nccl_log.read)
        if logs:
            out["nccl_log"], self.nccl_log_stats = nccl_log.read_many_stats(logs)
        return out

    nccl_log_stats: dict[str, Any] | None = None  # parse counters of the NCCL logs (nccl_log.STAT_KEYS)
    #: ranks whose Flight Recorder dump could not be used -> why (no evidence about them, never "missing")
    fr_unusable: dict[int, str] = field(default_factory=dict, init=False)
    fr_dumped: set[int] = field(default_factory=set, init=False)  # ranks whose dump was read

    def _flight_recorder_dumps(
        self, files: list[TraceFile], usable: Callable[[list[Path], Callable[[Path], object]], list[Path]]
    ) -> list[Path]:
        """One readable dump per rank: JSON, else the same rank's pickle (the same dump is often written both
        ways). Dumps that cannot be used (unreadable, cut, empty: `usable` names each in the warnings) and
        ranks without any dump are kept in `fr_unusable`, so the hang diagnosis counts them as no evidence."""
        from tracelens.ingest import flight_recorder
        from tracelens.ingest.sniff import FR_JSON, FR_PICKLE

        chosen: dict[int, Path] = {}
        why: dict[int, list[str]] = {}
        fr_files = [f for f in files if f.fmt in (FR_JSON, FR_PICKLE)]
        for fmt in (FR_JSON, FR_PICKLE):
            for f in fr_files:
                r = flight_recorder.rank_from_path(f.path)
                if f.fmt != fmt or (r is not None and r in chosen):
                    continue
                n = len(self.warnings)
                if usable([f.path], flight_recorder.read):
                    chosen[int(r) if r is not None else -1] = f.path
                elif r is not None:
                    why.setdefault(int(r), []).append(
                        self.warnings[n].removeprefix("skipped ")
                        if len(self.warnings) > n
                        else f"{f.path.name}: unreadable"
                    )
        # files beside the dumps that are not dumps at all (empty, garbage) are unusable dumps too
        seen = {f.path for f in fr_files}
        names = {(f.path.parent, flight_recorder.name_pattern(f.path)) for f in fr_files}
        for d in {f.path.parent for f in fr_files}:
            try:
                siblings = sorted(p for p in d.iterdir() if p.is_file() and p not in seen)
            except OSError:
                continue
            for p in siblings:  # named like the dumps beside it (`fr_trace_rank_<r>.json`), read as none
                r = flight_recorder.rank_from_path(p)
                if r is None or r in chosen or (d, flight_recorder.name_pattern(p)) not in names:
                    continue
                size = p.stat().st_size
                why.setdefault(int(r), []).append(
                    f"{p}: {'empty' if size == 0 else 'not a Flight Recorder dump'}"
                )
        self.fr_dumped = {r for r in chosen if r >= 0}
        if chosen:
            # ranks are 0..world-1: below the highest rank dumped (or the traces' world), one without a dump
            top = self.world_size or (max(chosen) + 1)
            world = set(range(top))
            for r in sorted(world - set(chosen) - set(why)):
                why[r] = ["no dump"]
            for r in sorted(set(why) - set(chosen)):
                self.fr_unusable[r] = "; ".join(why[r])
                self.warnings.append(
                    f"Flight Recorder: no usable dump from rank {r} ({self.fr_unusable[r]}): its collectives are "
                    "unknown, not missing (it is never named as a rank that did not join)"
                )
            for r in sorted(set(why) & set(chosen)):
                self.warnings.append(
                    f"Flight Recorder: rank {r}'s {chosen[r].name} was read instead of an unusable dump "
                    f"({'; '.join(why[r])})"
                )
        return [p for r, p in sorted(chosen.items())]

    @cached_property
    def nccl_sources(self) -> NcclSourcesResult | None:
        """Collective analysis of the logs / plugin dumps on their own (tracelens.analyze.comm.nccl_sources)."""
        nccl = self.nccl
        if not any(k in nccl for k in ("nccl_log", "nccl_plugin")):
            return None
        from tracelens.analyze.comm.nccl_sources import analyze_sources

        kineto = self.cross.collectives if self.cross is not None else None
        return self._guarded(
            "NCCL log / plugin analysis", lambda: analyze_sources(nccl, kineto, self.nccl_log_stats)
        )

    @cached_property
    def nccl_world(self) -> int | None:
        if self.world_size:
            return self.world_size
        for t in self.nccl.values():
            ranks = [r for r in t.column("rank").to_pylist() if r is not None]
            if ranks:
                return int(max(ranks)) + 1
        return None

    def nccl_findings(self) -> list[dict[str, Any]]:
        fr = self.nccl.get("flight_recorder")
        out: list[dict[str, Any]] = []
        if fr is not None and fr.num_rows:
            res = self._guarded("Flight Recorder hang diagnosis", self._fr_diagnosis)
            if res is not None:
                out = res.findings
                self.warnings += [
                    f"Flight Recorder: {n}" for n in res.notes if f"Flight Recorder: {n}" not in self.warnings
                ]
        return out + self.nccl_source_findings({f["code"] for f in out})

    def _fr_diagnosis(self) -> HangResult:
        """Hangs / desyncs from the Flight Recorder dumps, groups as the traces declare them, the Kineto
        collectives as evidence of who completed what (tracelens.analyze.comm.hang.diagnose_run)."""
        from tracelens.analyze.comm.hang import diagnose_run, trace_groups

        fr = self.nccl["flight_recorder"]
        world = self.nccl_world
        members, descs = trace_groups(self.metadata) if self.ranks else ({}, {})
        kineto = None
        if self._xevents.num_rows and self.cross is not None:
            kineto = self.cross.collectives
        return diagnose_run(
            fr,
            expected_ranks=range(world) if world else None,
            members=members,
            descs=descs,
            dumps=self.fr_dumped or None,
            kineto=kineto,
        )

    def nccl_source_findings(self, have: set[str]) -> list[dict[str, Any]]:
        """Hang / desync findings from logs and plugin dumps, unless Flight Recorder already gave that code."""
        res = self.nccl_sources
        return [f for f in res.findings if f["code"] not in have] if res is not None else []

    # ---- findings that need only the base tables ---------------------------------------------
    def base_findings(self) -> list[dict[str, Any]]:
        out = []
        ws = self.world_size
        expected = set(range(ws)) if ws else set()
        if self.options.rank_filter is not None and expected:
            from tracelens.discover import parse_rank_filter

            expected &= parse_rank_filter(self.options.rank_filter) or set()
        if ws and expected - set(self.ranks):
            missing = sorted(expected - set(self.ranks))
            shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
            out.append(
                finding(
                    "MISSING_RANKS",
                    "warning",
                    f"{len(missing)} of {ws} ranks have no trace ({shown}); cross-rank results are incomplete",
                    ranks=missing,
                )
            )
        if not self.steps and self.ranks:  # a folder of NCCL logs / plugin dumps only has no steps to miss
            out.append(
                finding(
                    "NO_STEPS",
                    "info",
                    "no ProfilerStep#N annotations: each rank's whole trace is analyzed as one window",
                )
            )
        out += self._guarded("step windows", self.step_window_findings) or []
        salvaged = self.metadata.filter(pa.compute.equal(self.metadata.column("salvaged"), True))
        bd = self.breakdown.select(["rank", "step"]).to_pylist()
        for row in salvaged.to_pylist():
            kept = sorted({b["step"] for b in bd if b["rank"] == row["rank"] and b["step"] is not None})
            steps = (
                f"complete steps analyzed: {', '.join(map(str, kept))}" if kept else "no complete step left"
            )
            if row.get("device_events_lost"):
                steps += "; every device event was lost: not comparable on the GPU path"
            out.append(
                finding(
                    "PARTIAL_TRACE",
                    "warning",
                    f"rank {row['rank']}: trace {Path(row['path']).name} was cut mid-write; salvaged the "
                    f"{row['events']:,} complete events before the cut ({steps})",
                    ranks=[row["rank"]],
                    salvaged_events=row["events"],
                    steps_analyzed=kept,
                )
            )
        out.extend(damaged_findings(self.metadata))
        return out

    def step_window_findings(self) -> list[dict[str, Any]]:
        """STEP_WINDOW_CLIPPED: ProfilerStep windows dropped or cut at the trace's end (analyze.rank.steps)."""
        from tracelens.analyze.rank.steps import window_findings

        return window_findings(self._xevents, self.breakdown)

    # ---- summary ------------------------------------------------------------------------------
    def rank_warnings(self) -> list[str]:
        """Say so when a trace's rank was assumed (a lone trace without rank info is taken as rank 0), and when
        its file name names another rank than its `distributedInfo.rank` (which is the one used: the profiler
        wrote it, a name can be copied or renamed)."""
        from tracelens.ingest.kineto import rank_from_name

        out = [
            f"{Path(f.path).name}: no rank in distributedInfo or the file name; analyzed as rank {f.rank}"
            for f in self.run.files
            if f.rank_source == "default"
        ]
        for f in self.run.files:
            named = rank_from_name(f.path) if f.rank_source == "distributedInfo" else None
            if named is not None and named != f.rank:
                out.append(
                    f"{Path(f.path).name}: the file name says rank {named}, distributedInfo.rank says {f.rank}; "
                    f"analyzed as rank {f.rank} (distributedInfo)"
                )
        return out

    def exposed_comm_findings(self, ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """EXPOSED_COMM_HIGH on exposed communication beyond pipeline waits.

        A pipeline stage that waits for its neighbour waits inside the P2P receive kernel, so that time is
        exposed communication and bubble at once; it is reported as a bubble, not here.
        """

        def beyond_bubble(r: dict[str, Any]) -> float:
            exposed = r["exposed_comm_ms"] or 0.0
            return exposed - min(r.get("bubble_ms") or 0.0, exposed)

        high = [
            r
            for r in ranks
            if r["step_time_ms"] and beyond_bubble(r) / r["step_time_ms"] > self.thresholds.exposed_comm
        ]
        if not high:
            return []
        worst = max(high, key=lambda r: beyond_bubble(r) / r["step_time_ms"])
        share = beyond_bubble(worst) / worst["step_time_ms"]
        waits = worst["exposed_comm_ms"] - beyond_bubble(worst)
        of_which = f"; {waits:.1f} ms more are pipeline waits" if waits > 0 else ""
        return [
            finding(
                "EXPOSED_COMM_HIGH",
                "warning",
                f"exposed communication (beyond pipeline waits) takes more than {self.thresholds.exposed_comm:.0%} of "
                f"the step on {len(high)} of {len(ranks)} ranks (worst: rank {worst['rank']}, {share:.0%}, "
                f"{beyond_bubble(worst):.1f} ms/step{of_which})",
                ranks=[r["rank"] for r in high],
                threshold=self.thresholds.exposed_comm,
            )
        ]

    # ---- per-op view (tracelens.ops_view, docs/ops.md) -----------------------------------------
    @cached_property
    def ops_view(self) -> OpsView | None:
        """Per-op FLOPs, time and roofline of one rank per stage (None when it could not be built)."""
        from tracelens.ops_view import ops_view

        return self._guarded("per-op view", lambda: ops_view(self))

    def result(self, release: bool = False) -> Result:
        """The result of this analysis, every part computed (`tracelens.summary.build_result`; `release`: the
        critical path is let go once its part is built, as `tracelens analyze` does)."""
        from tracelens.summary import build_result

        # (it waits for the background writes, before it collects the warnings)
        return build_result(self, release=release)

    def summary(self, release: bool = False) -> dict[str, Any]:
        """The summary.json document of this analysis (`result(release).to_json()`)."""
        return self.result(release).to_json()

    def keep_writing(self, what: str, done: Future[None]) -> None:
        """A cache file this analysis writes in the background (`done`: its writer's future); `wait_writes`
        waits for it."""
        self._writes.append((what, done))

    def wait_writes(self) -> None:
        """Wait for the cache files this analysis is writing in the background (the critical path's graph:
        `engine.kept.write_graph_later`; the cross-rank result: `engine.kept.write_cross_later`; the critical
        path's summary and the what-if: `store.results.write_tail_later`). A write that
        failed other than for want of room or rights (OSError: the result is computed again next time) is a
        warning, or raised in strict mode (tracelens.policy)."""
        while self._writes:
            what, done = self._writes.pop(0)
            self._guarded(f"keeping {what} in the cache", done.result)

    @property
    def grid_findings(self) -> list[dict[str, Any]]:
        """What inferring the grid found (LAYOUT_INCONSISTENT, a given layout the evidence contradicts...)."""
        return self._grid_and_findings[1]

    def computed(self, name: str) -> bool:
        """Whether the cached result `name` (e.g. "critical") was computed already (and not forgotten)."""
        return name in self.__dict__

    def forget(self, *names: str) -> None:
        """Let these computed results go (cached properties, e.g. "critical"); a later use computes them
        again. `tracelens analyze` lets the critical path's graph go (~0.4 GB at 1,024 ranks) once
        summary.json is built: the report does not draw it."""
        for name in names:
            self.__dict__.pop(name, None)

    def hta_compat(self) -> dict[str, Any]:
        """HolisticTraceAnalysis 0.5's temporal breakdown and comm/comp overlap, per rank."""
        from tracelens.analyze.rank import hta_compat

        return {
            "mode": "hta",
            "hta_version": hta_compat.HTA_VERSION,
            "ranks": hta_compat.summary_rows(self.events, self.metadata),
        }


def summary_of(path: str | Path, *, trace_files: bool = False, **options: Any) -> dict[str, Any]:
    """A summary from a summary.json file, a folder holding one (and no traces), or a run folder analyzed
    now (its tracelens.toml applies); with `trace_files` a single trace file is analyzed too (see
    `tracelens.summary.stored_summary`). What `check`, `compare` and the API read."""
    from tracelens.summary import load_summary, stored_summary

    stored = stored_summary(Path(path), trace_files)
    if stored is not None:
        return load_summary(stored)
    return analyze_run(path, Options(**options)).summary()


def analyze_run(path: str | Path, options: Options | None = None, defer_stages: bool = False) -> Analysis:
    """Load a run (folder or single trace file) with `tracelens.run.load_run` and return its lazily
    evaluated analysis; `options.engine` picks the executor of the per-rank tasks. `defer_stages`: the
    per-rank stages are computed when an analysis first needs them (`LoadOptions.defer_stages`)."""
    from tracelens.engine import ENGINES
    from tracelens.run import LoadOptions, load_run

    path = Path(path)
    if not path.exists():
        raise BadInputError(f"{path}: no such file or directory")
    options = options or Options()
    flag_warnings: list[str] = []
    given_gpu = options.gpu
    if path.is_dir():
        flag_warnings = _flag_conflicts(options, path)
        options = options.merged_with_config(path)
    engine = options.engine or "local"
    if engine not in ENGINES:
        raise BadInputError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    if options.scheduler and engine != "dask":
        raise BadInputError("--scheduler needs --engine dask")
    lopts = LoadOptions(
        no_cache=options.no_cache,
        cache_dir=options.cache_dir,
        salvage=options.salvage,
        ranks=options.rank_filter,
        progress=options.progress,  # type: ignore[arg-type]
        defer_stages=defer_stages,
    )
    if engine == "dask":
        from tracelens.engine.dask_engine import dask_executor

        with dask_executor(options.scheduler) as ex:
            run = load_run(path, lopts, ex)
    else:
        run = load_run(path, lopts)
    flag_warnings += _gpu_conflicts(options, given_gpu, run)
    return Analysis(path=path, options=options, run=run, warnings=flag_warnings)


def _gpu_conflicts(options: Options, given_gpu: str | None, run: Run) -> list[str]:
    """--gpu (or [hardware] gpu) against the GPU the traces name (analyze/efficiency/mfu_checks.py)."""
    from tracelens.analyze.efficiency.mfu_checks import gpu_conflicts

    if not options.gpu:
        return []
    names = run.metadata.column("gpu_name").to_pylist() if "gpu_name" in run.metadata.column_names else []
    return gpu_conflicts(options.gpu, names, from_config=not given_gpu)


def _flag_conflicts(options: Options, run_dir: Path) -> list[str]:
    """Flags that contradict run_dir/tracelens.toml (analyze/efficiency/mfu_checks.py); [] without a config."""
    from tracelens.analyze.efficiency.mfu_checks import flag_conflicts
    from tracelens.config import read_run_config

    try:
        cfg = read_run_config(run_dir)
    except TracelensError:
        return []  # a bad tracelens.toml is reported by merged_with_config
    return flag_conflicts(vars(options), cfg or {})


__all__ = ["Analysis", "Options", "analyze_run", "summary_of"]
