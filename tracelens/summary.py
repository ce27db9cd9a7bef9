"""summary.json: the stable, versioned result of `tracelens analyze` (schema "tracelens.summary/1").

Times are per-step means over the analyzed steps, in milliseconds. Unknown values are null, never invented.
See docs/summary.md for every field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tracelens._version import __version__
from tracelens.discover import left_out
from tracelens.errors import BadInputError
from tracelens.result import Finding, Result, freeze, summary_bytes
from tracelens.store.atomic import write_bytes
from tracelens.summary_check import SCHEMA, load_summary, validate_summary

if TYPE_CHECKING:
    import pandas as pd

    from tracelens.analyze.comm.nccl_sources import NcclSourcesResult
    from tracelens.analyze.comm.stragglers import CrossRankResult
    from tracelens.analyze.pipeline.composition import CompositionResult
    from tracelens.analyze.pipeline.pipeline import PipelineResult
    from tracelens.models.audit import AuditResult
    from tracelens.run_analysis import Analysis


_NS_PER_MS = 1e6


def _ms(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    if math.isnan(v):
        return None
    return round(v / _NS_PER_MS, 6)


def per_step_rows(bd: pa.Table, extra: dict[str, pa.Table] | None = None) -> list[dict[str, Any]]:
    """Per (rank, step) samples in ms: the breakdown plus any extra per (rank, step) columns (bubble, wait...).
    Read column by column (the columns used only: no dict per table row; a later row of an extra table
    overrides an earlier one of the same (rank, step), as row by row)."""
    lookups: dict[str, dict[Any, Any]] = {}
    for col, tab in (extra or {}).items():
        if tab is None:
            continue
        d = tab.select(["rank", "step", col]).to_pydict()
        lookups[col] = dict(zip(zip(d["rank"], d["step"]), d[col]))
    names = ["step_time", "compute", "exposed_comm", "overlapped_comm", "memcpy", "idle"]
    cols = bd.select(["rank", "step"] + [f"{n}_ns" for n in names]).to_pydict()
    ms = {n: [_ms(v) for v in cols[f"{n}_ns"]] for n in names}
    out = []
    for i, (rank, step) in enumerate(zip(cols["rank"], cols["step"])):
        row = {"rank": rank, "step": step}
        for n in names:
            row[f"{n}_ms"] = ms[n][i]
        for col, d in lookups.items():
            row[col.replace("_ns", "_ms")] = _ms(d.get((rank, step)))
        out.append(row)
    return out


def rank_rows(per_step: list[dict[str, Any]], stage_of: dict[int, int] | None) -> list[dict[str, Any]]:
    """Per-rank means over analyzed steps of every per-step field."""
    fields = [
        "step_time_ms",
        "compute_ms",
        "exposed_comm_ms",
        "exposed_wait_ms",
        "exposed_transfer_ms",
        "overlapped_comm_ms",
        "memcpy_ms",
        "idle_ms",
        "bubble_ms",
    ]
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in per_step:
        by_rank.setdefault(row["rank"], []).append(row)
    ranks = sorted(by_rank)
    out: list[dict[str, Any]] = [{"rank": rank, "stage": (stage_of or {}).get(rank)} for rank in ranks]
    n_rows = {len(by_rank[r]) for r in ranks}
    for f in fields:
        col = [r.get(f) for rank in ranks for r in by_rank[rank]]
        if len(n_rows) == 1 and col and None not in col:
            # every rank has as many steps, all with a value: the per-rank means of one (ranks x steps)
            # array, its rows summed as np.mean sums each rank's list (one reduction per contiguous row)
            n = n_rows.pop()
            n_rows.add(n)
            means = np.add.reduce(np.array(col, np.float64).reshape(len(ranks), n), axis=1) / n
            for rec, m in zip(out, means.tolist()):
                rec[f] = round(m, 6)
            continue
        for rec, rank in zip(out, ranks):
            vals = [v for v in (r.get(f) for r in by_rank[rank]) if v is not None]
            rec[f] = round(float(np.mean(vals)), 6) if vals else None
    for rec, rank in zip(out, ranks):
        rec["steps"] = len(by_rank[rank])
    return out


def build_summary(a: Analysis, release: bool = False) -> dict[str, Any]:
    """summary.json of an analysis: `build_result(a, release).to_json()`."""
    return build_result(a, release).to_json()


def build_result(a: Analysis, release: bool = False) -> Result:
    """The result of an analysis (`a`: `tracelens.run_analysis.Analysis`, which wires the analyzers), every
    part computed. `release`: let the critical path (its graph: ~0.4 GB at 1,024 ranks) go once its part is
    built, after the what-if, before the communication and op tables (`tracelens analyze`, which does not use
    it again; a later `a.critical` computes it again)."""
    cross, pipe, comp = a.cross, a.pipeline, a.composition
    extra = {}
    if cross is not None:
        extra["exposed_wait_ns"] = cross.exposed_split
        extra["exposed_transfer_ns"] = cross.exposed_split
    if pipe is not None:
        extra["bubble_ns"] = pipe.per_rank_step
    per_step = per_step_rows(a.breakdown, extra)
    ranks = rank_rows(per_step, a.stage_of)
    findings = a.base_findings()
    findings += a.grid_findings
    for part in (cross, pipe, comp):
        if part is not None:
            findings += part.findings
    findings += a.exposed_comm_findings(ranks)
    audit, audit_findings = a.audit(findings)
    findings += audit_findings
    findings += a.nccl_findings()
    findings += a.idle_findings()
    findings += a.p2p.findings if a.p2p is not None else []
    findings = a.time_shared_filter(a.straggler_stage_filter(findings))
    _ = a.mfu  # computes MFU, and its MFU_IMPOSSIBLE finding when the inputs are wrong
    findings += a.mfu_findings
    stages = []
    if pipe is not None:
        for st in pipe.stages:
            st = dict(st)
            if comp is not None and st["stage"] in comp.stages:
                st["layers"] = comp.stages[st["stage"]]
            stages.append(st)
    elif comp is not None:
        stages = [{"stage": s, "layers": layers} for s, layers in sorted(comp.stages.items())]
    headlines = []
    if cross is not None and len(a.ranks) > 1:
        headlines.append(cross.one_line())
    headlines += [f["message"] for f in findings if f["code"] == "COLLECTIVE_HANG"][:1]
    run = {
        "path": str(a.path),
        "name": run_name(a.path),
        "world_size": a.world_size if a.ranks else a.nccl_world,  # NCCL inputs only: from their ranks
        "ranks": a.ranks,
        "steps": a.steps,
        "gpu": a.gpu_name,
        "seq_len": a.options.seq_len,
        "layout": a.grid.to_dict(),
        "warnings": [],  # (filled last: what fails in any part below is one of them)
        "analysis_path": sorted(set(a.breakdown.column("path").to_pylist())),
    }
    if a.thresholds.changed():  # verdict thresholds the run's tracelens.toml set (tracelens.thresholds)
        run["thresholds"] = a.thresholds.changed()
    # the what-if replays now, before the communication and op tables below are built: the replays are the
    # analysis' last memory peak, and those tables would add to it
    what_if, critical_path = critical_and_what_if(a, findings, release)
    what_if, losses = prescription(a, findings, what_if, ranks, stages, cross, audit)
    out: dict[str, Any] = {
        "run": run,
        "ranks": ranks,
        "stages": stages,
        "stragglers": cross.stragglers if cross is not None else [],
        "mfu": a.mfu,
        "findings": findings,
        "per_step": per_step,
        "headlines": headlines,
        "composition": _with_comm(composition_dict(comp), a.comm_by_type),
        "pipeline": pipeline_dict(pipe),
        "clock": clock_dict(cross),
        "collectives": nccl_sources_dict(
            collectives_dict(cross, a.nccl, a.sized_collectives), a.nccl_sources, a
        ),
        "audit": audit.to_dict() if audit is not None else None,
    }
    a.forget("sized_collectives")  # (read above only: its frame, ~80 MB at 1,024 ranks, goes before the ops)
    out["ops"] = a.ops_view.summary_rows() if a.ops_view is not None else []
    out["op_totals"] = a.ops_view.total_rows() if a.ops_view is not None else []
    if a.inference is not None:  # (inference traces only: engine iterations, docs/inference.md)
        out["inference"] = a.inference
    out["what_if"] = what_if
    out["critical_path"] = critical_path
    out["losses"] = losses
    pm = a.pipeline_model if pipe is not None else None
    if pm is not None and out["pipeline"] is not None:
        out["pipeline"]["what_if_model"] = pm.evidence()
    if a.options.compat == "hta":
        out["compat"] = a.hta_compat()
    # the run's warnings once every part is built: an optional part that failed on odd input (tracelens.policy)
    # is in `a.warnings` by now, the what-if replays, the op view and the communication tables included, and
    # a cache file written in the background (the critical path's graph) that could not be
    a.wait_writes()
    run["warnings"] = (
        a.run.warnings
        + a.rank_warnings()
        + left_out(a.path, a.run.files)
        + (list(a.nccl_sources.notes) if a.nccl_sources is not None else [])
        + list(a.warnings)
        + (a.mfu_warnings if a.model is not None else [])
        + list(getattr(a.grid, "notes", []) or [])
        + (wait_split_warnings(ranks) if cross is not None else [])
    )
    out["findings"] = tuple(Finding.from_json(f) for f in findings)
    return Result(**{k: freeze(v) for k, v in out.items()}, tracelens_version=__version__)


def critical_and_what_if(
    a: Analysis, findings: list[dict[str, Any]], release: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """summary.json's `what_if` list (its `saving_ms` set on the findings it has a fix for) and its
    `critical_path` object. The run memo keeps them under a key of the graph's inputs and the what-if's
    (`store.results.tail_key`: the findings as they are now among them): a re-analysis that would replay the
    same graph for the same findings reads them back, with the warnings their computation gave, instead of
    replaying it. Not kept when a part failed (a warning of `tracelens.policy`: perhaps for want of memory)
    or the critical path was computed before (its warnings are then already in `a.warnings`). `release`: let
    the critical path go once its part is built (see `build_summary`)."""
    from tracelens.store import results

    where = a.what_if_key(findings)
    kept = results.read_tail(*where, findings=len(findings)) if where is not None else None
    if kept is not None:
        for i, saving in kept["savings"]:
            findings[i]["saving_ms"] = saving
        a.warnings.extend(kept["warnings"])
        return kept["what_if"], kept["critical_path"]
    n, failures, before = len(a.warnings), a.failures, [f.get("saving_ms", _UNSET) for f in findings]
    keep = where is not None and not a.computed("critical")
    what_if = a.what_if(findings)  # (the critical path's warnings, a graph it cannot order, come first)
    critical_path = a.critical.to_dict() if a.critical is not None else None
    if release:
        a.forget("critical")
    if where is not None and keep and a.failures == failures:
        savings = [
            [i, f["saving_ms"]]
            for i, (f, was) in enumerate(zip(findings, before))
            if "saving_ms" in f and (was is _UNSET or not results.same(was, f["saving_ms"]))
        ]
        tail = {
            "what_if": what_if,
            "critical_path": critical_path,
            "savings": savings,
            "warnings": a.warnings[n:],
        }
        a.keep_writing("the critical path and what-if", results.write_tail_later(where[0], where[1], tail))
    return what_if, critical_path


_UNSET = object()


def prescription(
    a: Analysis,
    findings: list[dict[str, Any]],
    what_if: list[dict[str, Any]],
    ranks: list[dict[str, Any]],
    stages: list[dict[str, Any]],
    cross: CrossRankResult | None,
    audit: AuditResult | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The schedule and layout what-if entries appended to `what_if`, PIPELINE_BUBBLE added to `findings`,
    every warning whose replayed fix saves under `min_saving` of the step made info (in place), and the
    ranked `losses` (tracelens.analyze.pipeline.prescribe)."""
    from tracelens.analyze.pipeline import prescribe

    def order(e: dict[str, Any]) -> float:  # largest saving first; an entry not replayed (saving null) last
        return -e["saving_ms"] if e.get("saving_ms") is not None else math.inf

    what_if = sorted(list(what_if) + a.schedule_what_if(), key=order)  # (stable)
    rows = [r for r in ranks if r.get("step_time_ms")]
    step = float(np.mean([r["step_time_ms"] for r in rows])) if rows else None
    t = a.thresholds
    if stages and any(s.get("bubble_ms") is not None for s in stages):
        findings += prescribe.bubble_findings(
            stages,
            pipeline_dict(a.pipeline),
            what_if,
            step,
            t.pipeline_bubble,
            t.pipeline_bubble_warning,
            t.min_saving,
        )
    prescribe.severity_by_saving(findings, step, t.min_saving)
    kv = audit.kv_replication if audit is not None else None
    losses = prescribe.losses(
        ranks,
        stages,
        findings,
        what_if,
        cross.stragglers if cross is not None else [],
        kv.get("duplicated_flops_fraction") if kv else None,
    )
    return what_if, losses


def composition_dict(comp: CompositionResult | None) -> dict[str, Any] | None:
    if comp is None:
        return None
    return {
        "source": comp.source,
        "rule": comp.rule,
        "time_share": comp.time_share,
        "stages": {str(k): v for k, v in comp.stages.items()},
        "per_stage_type_ms": {str(k): v for k, v in comp.per_stage_type_ms.items()},
        "per_stage_compute_ms": {str(k): v for k, v in comp.per_stage_compute.items()},
        "imbalance": comp.imbalance,
        "heavy_stage": comp.heavy_stage,
        "layer_split": comp.layer_split,
        "suggested_split": comp.suggested_split,
    }


def pipeline_dict(pipe: PipelineResult | None) -> dict[str, Any] | None:
    if pipe is None:
        return None
    return {
        "microbatches": pipe.microbatches,
        "schedule": pipe.schedule,
        "virtual_stages": pipe.virtual_stages,
        "expected_bubble_fraction": pipe.expected_bubble_fraction,
        "cause_stage": pipe.cause_stage,
        **({"schedule_evidence": _str_keys(pipe.schedule_evidence)} if pipe.schedule_evidence else {}),
    }


def _str_keys(d: Any) -> Any:
    """JSON-ready copy: int keys of nested dicts as strings."""
    return {str(k): _str_keys(v) for k, v in d.items()} if isinstance(d, dict) else d


def _with_comm(comp: dict[str, Any] | None, comm: dict[str, Any] | None) -> dict[str, Any] | None:
    """composition record plus `comm_by_type` (communication per layer type) when any was attributed."""
    if comm is None:
        return comp
    return {**(comp or {}), "comm_by_type": comm}


def clock_dict(cross: CrossRankResult | None) -> dict[str, Any] | None:
    if cross is None:
        return None
    return {"offsets_ms": {str(r): round(v / 1e6, 6) for r, v in sorted(cross.offsets_ns.items())}}


def collectives_dict(
    cross: CrossRankResult | None, nccl: dict[str, pa.Table], sized: pd.DataFrame | None = None
) -> dict[str, Any]:
    """Per op: instances, bytes, median bus bandwidth and arrival skew (small: per op, not per instance).
    `sized`: cross.collectives as a DataFrame, gloo sizes the trace lacks filled from the Flight Recorder."""
    out: dict[str, Any] = {"sources": {k: int(v.num_rows) for k, v in nccl.items()}, "by_op": []}
    if cross is None or cross.collectives.num_rows == 0:
        return out
    df = sized if sized is not None else cross.collectives.to_pandas()
    out["sources"]["kineto"] = int(len(df))
    cols = set(df.columns)
    df = df[
        [c for c in ("op", "bytes", "busbw_gbps", "bus_n", "bus_n_from", "arrival_skew_ns", "n_participants")
         if c in cols]
    ]  # fmt: skip
    for op, g in df.groupby("op", observed=True):  # (over the columns read here only: each group is a copy)
        # unknown sizes stay unknown: null when no call's size is known, and the count of unknown ones
        known = g["bytes"].dropna()
        rec = {"op": str(op), "calls": int(len(g)), "bytes": int(known.sum()) if len(known) else None}
        if len(known) < len(g):
            rec["calls_bytes_unknown"] = int(len(g) - len(known))
        if "busbw_gbps" in cols:
            rec["busbw_gbps_median"] = _median(g["busbw_gbps"])
            if "bus_n" in cols:
                rec["busbw_n"] = _bus_n_text(g)
        if "arrival_skew_ns" in cols:
            # skew needs a second participant: instances seen on one rank only have none (null, not 0)
            seen = g["n_participants"] > 1 if "n_participants" in cols else slice(None)
            v = _median(g["arrival_skew_ns"][seen])
            rec["skew_ms_median"] = None if v is None else v / 1e6
        out["by_op"].append(rec)
    return out


def _bus_n_text(g: pd.DataFrame) -> str | None:
    """The n of the bus-bandwidth factor of an op's calls that have a bus bandwidth, and where it comes from
    (analyze.comm.collectives.BUS_N_SOURCES): "128 (world size)"; distinct ones joined, largest first ("4 (group
    size), 2 (group size)"); null when no call has one."""
    import pandas as pd

    rows = g[g["busbw_gbps"].notna()]
    froms = rows["bus_n_from"] if "bus_n_from" in rows else pd.Series([None] * len(rows), index=rows.index)
    pairs = {
        (int(n), "" if pd.isna(w) else str(w).replace("_", " "))
        for n, w in zip(rows["bus_n"], froms)
        if not pd.isna(n)
    }
    return (
        ", ".join(f"{n} ({w})" if w else str(n) for n, w in sorted(pairs, key=lambda p: (-p[0], p[1])))
        or None
    )


def wait_split_warnings(ranks: list[dict[str, Any]]) -> list[str]:
    """Say why exposed communication has no wait / transfer split (collectives.exposed_split)."""
    blind = [
        r["rank"] for r in ranks if (r.get("exposed_comm_ms") or 0) > 0 and r.get("exposed_wait_ms") is None
    ]
    if not blind:
        return []
    shown = ", ".join(map(str, blind[:16])) + (" ..." if len(blind) > 16 else "")
    return [
        f"exposed communication on rank(s) {shown} is not split into wait and transfer (null): their "
        "collectives' other participants are not in the traces, and without them waiting for a late rank "
        "cannot be told from moving data"
    ]


def nccl_sources_dict(
    out: dict[str, Any], res: NcclSourcesResult | None, analysis: Analysis | None = None
) -> dict[str, Any]:
    """Add the log / plugin analysis to the summary's "collectives": per-op rows when no Kineto trace gave
    any, per-process and per-communicator tables, the Kineto cross-check and the log parse counters."""
    if res is None:
        return out
    if not out["by_op"]:
        out["by_op"] = list(res.by_op)
    out["processes"] = res.processes
    out["communicators"] = res.communicators
    out["cross_check"] = res.cross_check
    stats = getattr(analysis, "nccl_log_stats", None)
    if stats:
        out["log_parse"] = dict(stats)
    return out


def _median(series: pd.Series) -> float | None:
    v = series.dropna()
    return float(v.median()) if len(v) else None


def write_summary(summary: dict[str, Any], path: Path) -> None:
    """Write atomically: a reader never sees half a file."""
    write_bytes(path, summary_bytes(summary))


def stored_summary(path: Path, trace_files: bool = False) -> Path | None:
    """The summary.json that `path` names, or None when it names a run to analyze: a folder's summary.json
    when the folder holds no trace files; a file itself, except with `trace_files` (compare, which also
    takes single traces) a file that is not a .json holding the schema mark or named summary*."""
    path = Path(path)
    if not path.exists():
        raise BadInputError(f"{path}: no such file or directory")
    if path.is_dir():
        f = path / "summary.json"
        return f if f.is_file() and not any(path.glob("*trace*.json*")) else None
    if not trace_files:
        return path
    if path.suffix == ".json":
        with open(path, "rb") as fh:
            head = fh.read(65536)
        if b'"tracelens.summary/' in head or "summary" in path.name:
            return path
    return None


def run_name(path: Path) -> str:
    """A run's name: its folder or file name without .json / .gz."""
    path = Path(path).resolve()
    name = path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or "run"


__all__ = [
    "SCHEMA",
    "build_summary",
    "load_summary",
    "run_name",
    "stored_summary",
    "validate_summary",
    "write_summary",
    "per_step_rows",
    "rank_rows",
    "__version__",
]
