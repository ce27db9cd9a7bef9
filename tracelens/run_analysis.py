"""Run every analyzer on one run and hold the results: the one place that wires analyzers together.

The CLI, the notebook API and `summarize` all go through `analyze_run`, so they agree by construction.
Analyzers stay pure; this module decides what runs (given the options and what the traces hold).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracelens import __version__
from tracelens.analyze.breakdown import breakdown, class_sets
from tracelens.errors import BadInputError
from tracelens.findings import finding


@dataclass
class Options:
    """Everything a user can say about a run beyond its traces (CLI flags win over tracelens.toml)."""

    layout: str | None = None  # "tp=4,pp=4,dp=2,cp=1"
    order: str | None = None  # "tp-cp-dp-pp"
    model: str | None = None  # preset name or config.json path
    seq_len: int | None = None
    global_batch: int | None = None  # sequences per step
    microbatches: int | None = None
    schedule: str | None = None
    peak_tflops: float | None = None
    gpu: str | None = None
    compat: str | None = None  # "hta"
    no_cache: bool = False
    progress: object = None  # callable(done, total) for the CLI's progress bar

    def merged_with_config(self, run_dir: Path) -> Options:
        """Fill unset options from run_dir/tracelens.toml when present."""
        try:
            from tracelens.config import read_run_config
        except ImportError:
            return self
        cfg = read_run_config(run_dir)
        if not cfg:
            return self
        vals = dataclasses.asdict(self)
        for k, v in cfg.items():
            if k in vals and vals[k] is None and v is not None:
                vals[k] = v
        vals["progress"] = self.progress
        return Options(**vals)


@dataclass
class Analysis:
    """Results of one run's analysis; heavy parts are computed on first access and cached."""

    path: Path
    options: Options
    tables: object  # tracelens.loader.Tables
    warnings: list[str] = field(default_factory=list)

    # ---- base tables -------------------------------------------------------------------------
    @property
    def events(self) -> pa.Table:
        return self.tables.events

    @property
    def metadata(self) -> pa.Table:
        return self.tables.metadata

    @cached_property
    def sets(self):
        return class_sets(self.events)

    @cached_property
    def breakdown(self) -> pa.Table:
        return breakdown(self.events, sets=self.sets)

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
    def model(self):
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
    def mfu(self) -> dict | None:
        """The summary's "mfu" object, or None when the model is unknown."""
        if self.model is None:
            return None
        from tracelens.analyze.mfu import compute_mfu

        seq = self.options.seq_len
        tokens = seq * self.options.global_batch if seq and self.options.global_batch else None
        steps = self.step_times_s
        mean_step = float(np.mean(list(steps.values()))) if steps else None
        return compute_mfu(
            self.model,
            seq,
            tokens,
            mean_step,
            self.world_size or len(self.ranks),
            self.peak_flops,
            step_times_s=steps or None,
            lost_time_s=self.lost_time_s(),
        )

    def lost_time_s(self) -> dict[str, float] | None:
        """Mean over ranks of the per-step bubble and exposed communication, in seconds."""
        bd = self.breakdown
        if bd.num_rows == 0:
            return None
        exposed = float(np.mean(bd.column("exposed_comm_ns").to_numpy())) / 1e9
        out = {"exposed_comm": exposed}
        bubble = self.bubble_per_rank_step
        if bubble is not None and bubble.num_rows:
            out["bubble"] = float(np.mean(bubble.column("bubble_ns").to_numpy())) / 1e9
        return out

    @cached_property
    def bubble_per_rank_step(self) -> pa.Table | None:
        return None

    # ---- findings that need only the base tables ---------------------------------------------
    def base_findings(self) -> list[dict]:
        out = []
        ws = self.world_size
        if ws and len(self.ranks) < ws:
            missing = sorted(set(range(ws)) - set(self.ranks))
            shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
            out.append(
                finding(
                    "MISSING_RANKS",
                    "warning",
                    f"{len(missing)} of {ws} ranks have no trace ({shown}); cross-rank results are incomplete",
                    ranks=missing,
                )
            )
        if not self.steps:
            out.append(
                finding(
                    "NO_STEPS",
                    "info",
                    "no ProfilerStep#N annotations: each rank's whole trace is analyzed as one window",
                )
            )
        salvaged = self.metadata.filter(pa.compute.equal(self.metadata.column("salvaged"), True))
        for row in salvaged.to_pylist():
            frac = row.get("salvaged_fraction")
            pct = f"{100 * frac:.0f}% of its bytes" if frac is not None else "part of it"
            out.append(
                finding(
                    "PARTIAL_TRACE",
                    "warning",
                    f"rank {row['rank']}: trace {Path(row['path']).name} is truncated; "
                    f"salvaged {row['events']} events ({pct})",
                    ranks=[row["rank"]],
                )
            )
        return out

    # ---- summary ------------------------------------------------------------------------------
    def summary(self) -> dict:
        from tracelens import summary as S

        per_step = S.per_step_rows(self.breakdown)
        findings = self.base_findings()
        run = {
            "path": str(self.path),
            "name": run_name(self.path),
            "world_size": self.world_size,
            "ranks": self.ranks,
            "steps": self.steps,
            "gpu": self.gpu_name,
            "seq_len": self.options.seq_len,
            "layout": {"tp": None, "pp": None, "dp": None, "cp": None, "order": None, "source": "none"},
            "warnings": list(self.warnings),
            "analysis_path": sorted(set(self.breakdown.column("path").to_pylist())),
        }
        out = {
            "schema": S.SCHEMA,
            "tracelens_version": __version__,
            "run": run,
            "ranks": S.rank_rows(per_step, None),
            "stages": [],
            "stragglers": [],
            "mfu": self.mfu,
            "findings": findings,
            "per_step": per_step,
        }
        if self.options.compat == "hta":
            out["compat"] = self.hta_compat()
        return out

    def hta_compat(self) -> dict:
        """HolisticTraceAnalysis 0.5's temporal breakdown and comm/comp overlap, per rank."""
        from tracelens.analyze import hta_compat

        return {
            "mode": "hta",
            "hta_version": hta_compat.HTA_VERSION,
            "ranks": hta_compat.summary_rows(self.events, self.metadata),
        }


def run_name(path: Path) -> str:
    path = Path(path).resolve()
    name = path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or "run"


def analyze_run(path: str | Path, options: Options | None = None) -> Analysis:
    """Load a run (folder or single trace file) and return its lazily evaluated analysis."""
    from tracelens.loader import load_tables

    path = Path(path)
    if not path.exists():
        raise BadInputError(f"{path}: no such file or directory")
    options = options or Options()
    if path.is_dir():
        options = options.merged_with_config(path)
    tables = load_tables(path, no_cache=options.no_cache, progress=options.progress)
    return Analysis(path=path, options=options, tables=tables)

