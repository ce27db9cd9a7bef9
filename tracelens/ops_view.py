"""Wires the per-op view to a run's analysis: which ranks, their events, their recorded shapes.

By default one rank per pipeline stage is looked at (the lowest rank of each stage; the lowest rank of
the run when stages are unknown): ranks of a stage run the same ops, and reading shapes costs a second
pass over a trace file. `ranks=` asks for others (`Run.ops(ranks=...)`, `tracelens analyze --ops`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from tracelens.analyze.efficiency import ops as O


@dataclass
class OpsView:
    """The per-op tables of some ranks of a run (tracelens.analyze.efficiency.ops columns)."""

    ranks: list[int]
    instances: pd.DataFrame
    ops: pd.DataFrame
    kernels: pd.DataFrame
    launches: pd.DataFrame  # of `ranks` and (default view) of the stragglers
    shapes_recorded: bool  # any op of these ranks carries Input Dims

    def summary_rows(self) -> list[dict]:
        return O.summary_rows(self.ops)

    def total_rows(self) -> list[dict]:
        return O.total_rows(self.ops)


def default_ranks(analysis) -> list[int]:
    """The lowest rank of every stage (or of the run)."""
    stage_of = analysis.stage_of or {}
    firsts: dict[int, int] = {}
    for r in analysis.ranks:
        s = stage_of.get(r)
        if s is not None and (s not in firsts or r < firsts[s]):
            firsts[s] = r
    if firsts:
        return sorted(firsts.values())
    return analysis.ranks[:1]


def _paths(analysis) -> dict[int, str]:
    """rank -> Kineto file, from the discovered files (metadata paths may be relative to another folder)."""
    from pathlib import Path

    from tracelens.ingest.sniff import KINETO

    out: dict[int, str] = {}
    for f in analysis.run.files:
        if f.fmt == KINETO and f.rank is not None:
            out.setdefault(int(f.rank), str(f.path))
    if not out:
        md = analysis.metadata
        for r, p in zip(md.column("rank").to_pylist(), md.column("path").to_pylist()):
            if p and Path(p).exists():
                out[int(r)] = str(p)
    return out


def _shapes(analysis, ranks: list[int]) -> pa.Table:
    from tracelens.ingest.op_shapes import OP_SHAPES, read

    paths = _paths(analysis)
    parts = []
    for r in ranks:
        p = paths.get(r)
        if not p:
            continue
        t = read(p)
        if t.num_rows:
            parts.append(t.append_column("rank", pa.array([r] * t.num_rows, pa.int32())))
    if not parts:
        return OP_SHAPES.append(pa.field("rank", pa.int32())).empty_table()
    return pa.concat_tables(parts)


def _spans_of(analysis, ranks: list[int]) -> pa.Table | None:
    try:
        sp = analysis.spans
    except Exception:  # noqa: BLE001 - module spans are optional here (layer_type null)
        return None
    if sp is None or sp.num_rows == 0:
        return None
    import pyarrow.compute as pc

    return sp.filter(pc.is_in(sp.column("rank"), value_set=pa.array(ranks, pa.int32())))


def ops_view(analysis, ranks: list[int] | None = None) -> OpsView:
    """The op, kernel and launch tables of `ranks` (default: default_ranks) over the analyzed steps."""

    ranks_given = ranks
    ranks = sorted({int(r) for r in (ranks if ranks is not None else default_ranks(analysis))})
    ev = analysis.run.events_of(ranks, O.EVENT_COLUMNS) if ranks else None
    steps = list(analysis.steps) or None
    if ev is None or ev.num_rows == 0:
        return OpsView(
            ranks, pd.DataFrame(), pd.DataFrame(columns=O.OP_COLUMNS), pd.DataFrame(), pd.DataFrame(), False
        )
    shapes = _shapes(analysis, ranks)
    inst = O.op_instances(ev, shapes, steps, _spans_of(analysis, ranks))
    launches = _launches(analysis, ranks, ev, steps, default=ranks_given is None)
    del ev  # (the op and kernel tables read the instances only: the events are let go before them)
    n_steps = _steps_per_rank(analysis, ranks, inst)
    stage_of = analysis.stage_of
    return OpsView(
        ranks=ranks,
        instances=inst,
        ops=O.op_table(
            inst, analysis.gpu_name, n_steps, stage_of, _contexts(analysis), _moe_context(analysis)
        ),
        kernels=O.kernel_table(inst, n_steps, stage_of),
        launches=launches,
        shapes_recorded=shapes.num_rows > 0,
    )


def _contexts(analysis) -> dict | None:
    """(rank, step) -> OpContext of the engine iteration there (Analysis.iteration_contexts), if any."""
    try:
        return analysis.iteration_contexts or None
    except Exception:  # noqa: BLE001 - contexts are optional here (the ops that need one: null FLOPs)
        return None


def _moe_context(analysis):
    """The model config's MoE top-k and expert size (OpContext), for fused MoE layers; None without a MoE
    model."""
    from tracelens.models.op_flops import OpContext

    try:
        model = analysis.model
    except Exception:  # noqa: BLE001 - a model that does not load is reported elsewhere
        return None
    if model is None or not getattr(model, "num_experts", 0):
        return None
    return OpContext(
        moe_top_k=model.num_experts_per_tok or None,
        moe_intermediate=model.moe_intermediate_size or None,
        moe_gated=bool(model.gated_mlp),
    )


def _launches(analysis, ranks: list[int], ev: pa.Table, steps, default: bool) -> pd.DataFrame:
    """Launch statistics of `ranks` and, by default, of the stragglers too (evidence for a host-bound one)."""

    extra: list[int] = []
    if default:
        try:
            cross = analysis.cross
            extra = sorted(
                {int(s["rank"]) for s in (cross.stragglers if cross is not None else [])} - set(ranks)
            )
        except Exception:  # noqa: BLE001 - stragglers are optional here
            extra = []
    out = O.launch_stats(ev, steps)
    if extra:
        more = O.launch_stats(analysis.run.events_of(extra, O.EVENT_COLUMNS), steps)
        out = pd.concat([out, more], ignore_index=True)
    return out.sort_values("rank").reset_index(drop=True) if not out.empty else out


def _steps_per_rank(analysis, ranks: list[int], inst: pd.DataFrame) -> dict[int, int]:
    """Analyzed steps per rank (from the breakdown), else the distinct steps its op instances fall in."""
    out: dict[int, int] = {}
    bd = analysis.breakdown
    if bd is not None and bd.num_rows:
        df = bd.select(["rank", "step"]).to_pandas().dropna()
        out = {int(r): int(n) for r, n in df.groupby("rank")["step"].nunique().items()}
    for r in ranks:
        if not out.get(r):  # no steps: the whole trace is one "step"
            n = int(inst.loc[inst["rank"] == r, "step"].nunique()) if not inst.empty else 0
            out[r] = max(n, 1)
    return out
