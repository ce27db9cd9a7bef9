"""Notebook API: `run = tracelens.load(path)`; properties are computed on first use and cached.

Every DataFrame follows one convention (tracelens.frames): strings work with pandas' `.str` (repeated
strings are `category`), numbers keep Arrow dtypes (exact integers, nulls stay null), every table has a
`stage` column, and units are in column names: event tables (events, kernels, memory, collectives) in
integer nanoseconds (`*_ns`), per-step and per-rank tables (breakdown, bubbles, arrival_lag, stages,
stragglers) in milliseconds (`*_ms`), like summary.json.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa

if TYPE_CHECKING:
    from tracelens.result import Result


def _df(table: pa.Table, stage_of=None) -> pd.DataFrame:
    """DataFrame under the API's conventions (tracelens.frames: `.str`-usable strings, a stage column)."""
    from tracelens.frames import to_frame

    return to_frame(table, stage_of)


class Run:
    """One run (a folder of per-rank traces or a single trace) opened for analysis."""

    def __init__(self, path: str | Path, no_cache: bool = False, **options):
        from tracelens.run_analysis import Options, analyze_run

        self.path = Path(path)
        # the per-rank stages wait for the first analysis: reading the events costs the read alone
        self._analysis = analyze_run(self.path, Options(no_cache=no_cache, **options), defer_stages=True)
        self._summary: dict | None = None
        self._result: Result | None = None

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
        return _df(self._analysis.events, self._stage_of)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Device events only (kernels, memcpy, memset), with their class (compute/communication/memory)."""
        from tracelens.analyze.rank.classify import CLASS_NAMES, classify

        ev = self._analysis.events
        cls = classify(ev)
        kinds = ev.column("kind").cast(pa.string())
        mask = pa.compute.is_in(kinds, pa.array(["kernel", "gpu_memcpy", "gpu_memset"]))
        sub = ev.filter(mask)
        names = [CLASS_NAMES[int(c)] for c in cls[mask.to_numpy(zero_copy_only=False)]]
        sub = sub.append_column("class", pa.array(names, pa.string()).dictionary_encode())
        return _df(sub, self._stage_of)

    @cached_property
    def memory(self) -> pd.DataFrame:
        """`[memory]` events: allocated and reserved bytes over time per rank."""
        return _df(self._analysis.run.memory, self._stage_of)

    @cached_property
    def metadata(self) -> pd.DataFrame:
        """One row per rank: world size, host, GPU, process groups, file."""
        return _df(self._analysis.metadata, self._stage_of)

    def breakdown(self) -> pd.DataFrame:
        """Per (rank, step): step time, compute, overlapped / exposed communication, memcpy, idle, in ms
        (`*_ms`; the per-step numbers behind summary.json's per-rank means), with the rank's stage."""
        from tracelens.frames import ns_to_ms

        return _df(ns_to_ms(self._analysis.breakdown), self._stage_of)

    def collectives(self) -> pd.DataFrame:
        """One row per (rank, collective instance): op, bytes, group, seq, start/end, wait vs transfer, busbw."""
        cross = self._analysis.cross
        if cross is None:
            return _df(self._nccl_only_collectives(), self._stage_of)
        return _df(cross.collectives, self._stage_of)

    def _nccl_only_collectives(self) -> pa.Table:
        """Without Kineto traces: the rows of the NCCL logs and plugin dumps (rank null when unknown)."""
        from tracelens import schema

        tables = [
            t for k, t in self._analysis.nccl.items() if k in ("nccl_log", "nccl_plugin") and t.num_rows
        ]
        if not tables:
            return schema.COLLECTIVES.empty_table()
        return pa.concat_tables(tables, promote_options="permissive").combine_chunks().unify_dictionaries()

    def arrival_lag(self) -> pd.DataFrame:
        """Rank x step table of how late each rank arrived at its collectives, in ms (0 = never the last):
        one column per step named `step<N>_lag_ms` (`whole_trace_lag_ms` without step markers), after the
        rank's `stage`; the index is the rank."""
        cross = self._analysis.cross
        if cross is None or cross.arrival_lag.num_rows == 0:
            return pd.DataFrame()
        df = cross.arrival_lag.to_pandas()
        df["step"] = df["step"].astype("Int64").fillna(-1)  # (no step markers: the whole trace)
        lag = df.pivot_table(index="rank", columns="step", values="lag_ns", aggfunc="sum") / 1e6
        lag.columns = ["whole_trace_lag_ms" if int(s) < 0 else f"step{int(s)}_lag_ms" for s in lag.columns]
        lag = lag.rename_axis(index="rank")
        lag.insert(0, "stage", pd.array([(self._stage_of or {}).get(int(r)) for r in lag.index], "Int64"))
        return lag

    def stragglers(self) -> pd.DataFrame:
        """Straggler verdicts (rank, cause, cost_ms, steps flagged, evidence); empty when there is none."""
        cross = self._analysis.cross
        rows = cross.stragglers if cross is not None else []
        df = pd.DataFrame(
            rows, columns=["rank", "cause", "cost_ms", "steps_flagged", "steps_total", "score", "evidence"]
        )
        df.insert(1, "stage", pd.array([(self._stage_of or {}).get(int(r)) for r in df["rank"]], "Int64"))
        return df

    def bubbles(self) -> pd.DataFrame:
        """Per (rank, step): pipeline bubble (fill, drain, in-flight waits) in ms; empty without pipeline stages."""
        from tracelens.frames import ns_to_ms

        pipe = self._analysis.pipeline
        if pipe is None:
            return pd.DataFrame(columns=["rank", "stage", "step", "bubble_ms"])
        return _df(ns_to_ms(pipe.per_rank_step), self._stage_of)

    def stages(self) -> pd.DataFrame:
        """Per pipeline stage: ranks, layer types, compute, bubble fraction vs the schedule's expectation."""
        return pd.DataFrame(self.summary()["stages"])

    def findings(self) -> pd.DataFrame:
        """Every finding (code, severity, message, ranks, stages): `stages` lists the stages it names."""
        return pd.DataFrame(
            self.summary()["findings"], columns=["code", "severity", "message", "ranks", "stages"]
        )

    def result(self) -> Result:
        """The typed result of the analysis (`tracelens.result.Result`: frozen; its `findings` are `Finding`s);
        computed once."""
        if self._result is None:
            self._result = self._analysis.result()
        return self._result

    def summary(self) -> dict:
        """The summary.json content (schema tracelens.summary/1): `result().to_json()`; computed once."""
        if self._summary is None:
            self._summary = self.result().to_json()
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
        TB/s, roofline bound and % (tracelens.analyze.efficiency.ops.OP_COLUMNS); `ranks`: which ranks (default one
        per stage)."""
        return self._ops_view(ranks).ops.copy()

    def kernel_table(self, ranks=None) -> pd.DataFrame:
        """Kernels (short names) by time per step, with the op that launches them most."""
        return self._ops_view(ranks).kernels.copy()

    def launch_stats(self, ranks=None) -> pd.DataFrame:
        """Per rank: kernel launch delay (CPU launch to GPU start) and the share of short kernels."""
        return self._with_stage(self._ops_view(ranks).launches.copy())

    def memory_timeline(self) -> pd.DataFrame:
        """Allocator samples per rank: ts_ns, allocated and reserved bytes (from `[memory]` events)."""
        from tracelens.analyze.efficiency.ops import memory_timeline

        return self._with_stage(memory_timeline(self._analysis.run.memory))

    def _with_stage(self, df: pd.DataFrame) -> pd.DataFrame:
        """`df` with the rank's pipeline stage after `rank` (null without stages), as every API table has."""
        if "rank" in df.columns and "stage" not in df.columns:
            st = self._stage_of or {}
            df.insert(1, "stage", pd.array([st.get(int(r)) for r in df["rank"]], "Int64"))
        return df

    def memory_peaks(self) -> pd.DataFrame:
        """Per rank: peak allocated / reserved bytes, when, and the CPU op running at the peak."""
        from tracelens.views import memory_peaks_of

        stage_of = {int(r["rank"]): r.get("stage") for r in self.summary().get("ranks") or []}
        return memory_peaks_of(self._analysis, stage_of)

    # ---- the same outputs as the CLI (notebook users get report, figures, compare, check) ----
    @property
    def _stage_of(self) -> dict[int, int] | None:
        """rank -> pipeline stage under the layout the findings use (None without pipeline stages)."""
        return self._analysis.stage_of

    def report(self, path: str | Path) -> Path:
        """Write the HTML report `tracelens analyze` writes (same sections and figures) to `path`."""
        from tracelens.outputs import guard_outputs
        from tracelens.report.html import write_report
        from tracelens.views import ReportViews

        path = Path(path)
        guard_outputs([path], [self.path], force=True)  # never over or into the run's traces
        write_report(self.summary(), path, ReportViews(self._analysis))
        return path

    def figures(self) -> dict[str, object]:
        """The report's Plotly figures by section title (`go.Figure` objects, built by the same functions
        as report.html; a section with several figures gives "title", "title (2)", ...)."""
        from tracelens.report.html import build_sections
        from tracelens.report.sections import figures_of
        from tracelens.views import ReportViews

        return figures_of(build_sections(ReportViews(self._analysis), self.summary()))


def _side(x) -> dict:
    """A Run, a summary dict, or a path (run folder, trace, summary.json) -> summary dict, as the CLI reads it."""
    if isinstance(x, Run):
        return x.summary()
    if isinstance(x, dict):
        return x
    from tracelens.commands.compare import load_side

    return load_side(Path(x))


def compare(a, b, labels: tuple[str, str] | None = None) -> dict:
    """What `tracelens compare A B` computes (the compare.json dict: metrics, text, stragglers, findings).

    `a`, `b`: a Run, a summary dict, or a path (run folder, trace or summary.json). Write the HTML with
    `tracelens.report.html.write_compare_report(result, path)`.
    """
    from tracelens.summaries.compare import compare as _compare
    from tracelens.summary import run_name

    names = labels or tuple(
        x.path.name
        if isinstance(x, Run)
        else (x.get("run") or {}).get("name", "run")
        if isinstance(x, dict)
        else run_name(x)
        for x in (a, b)
    )
    return _compare(_side(a), _side(b), tuple(names))


def compare_ops(comparison: dict, table: str = "ops") -> pd.DataFrame:
    """One table of a comparison's per-op part (`compare(a, b)["ops"]`) as a DataFrame: `table` "ops" (matched
    on the op and its input shapes), "kernels", "layer_types" or "stages"; a_*/b_* columns per side,
    delta_ms and share_of_step_change, largest change first (docs/ops.md, "Comparing two runs")."""
    rows = (comparison.get("ops") or {}).get(table)
    if rows is None:
        raise ValueError(f"no per-op table {table!r} in this comparison (ops, kernels, layer_types, stages)")
    return pd.DataFrame(rows)


def check(baseline, current, rules=None, strict: bool = False, allow_setup_change: bool = False):
    """What `tracelens check BASELINE CURRENT` computes: a `tracelens.summaries.regress.CheckReport`
    (`.exit_code`, `.results`; `tracelens.report.check_renderers.render(report, "text")` formats it).
    Arguments as for `compare`; `rules`: a rules.toml path or a `regress.Rules`."""
    from tracelens.summaries import regress

    rule_set = rules if isinstance(rules, regress.Rules) else regress.load_rules(rules)
    base = (
        baseline.summary() if isinstance(baseline, Run) else baseline if isinstance(baseline, dict) else None
    )
    cur = current.summary() if isinstance(current, Run) else current if isinstance(current, dict) else None
    from tracelens.run_analysis import summary_of

    base = base if base is not None else summary_of(baseline)
    cur = cur if cur is not None else summary_of(current)
    return regress.check(base, cur, rule_set, strict=strict, allow_setup_change=allow_setup_change)
