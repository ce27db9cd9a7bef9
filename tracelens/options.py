"""What a user can say about a run beyond its traces: `Options` (CLI flags, which win over tracelens.toml).
`tracelens.run_analysis` analyzes a run with them (and exports the name, as it always has)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracelens.errors import BadInputError

if TYPE_CHECKING:
    from tracelens.thresholds import Thresholds


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
    cache_dir: str | None = None  # cache root (default: the user cache folder, tracelens.store.cache)
    rank_filter: str | None = None  # "0-7,12": analyze only these ranks (a mixed or duplicate folder)
    salvage: bool = True  # keep the complete events of a trace cut mid-write (PARTIAL_TRACE)
    engine: str | None = None  # "local" (default) | "dask": where the per-rank tasks run (tracelens.engine)
    scheduler: str | None = None  # Dask scheduler address for engine "dask" (None: a LocalCluster)
    progress: object = None  # callable(done, total) for the CLI's progress bar
    force_layout: bool = False  # keep --layout even when the traces' process groups contradict it
    layer_pattern: str | None = (
        None  # [model] layer_pattern: extra layer-annotation regex (analyze/pipeline/layers.py)
    )
    virtual_stages: int | None = None  # [training] virtual_stages: interleaved model chunks per rank
    thresholds: dict[str, float] | None = None  # [thresholds]: verdict thresholds (tracelens.thresholds)

    @property
    def verdict_thresholds(self) -> Thresholds:
        """The verdict thresholds: the defaults with `thresholds` over them."""
        from tracelens.thresholds import DEFAULT, from_config

        return from_config(self.thresholds) if self.thresholds else DEFAULT

    def __post_init__(self) -> None:
        # counts and rates given as options must be positive (`--seq-len -5` is a typo, not a run)
        for k in ("seq_len", "global_batch", "microbatches", "peak_tflops"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise BadInputError(f"--{k.replace('_', '-')} {v}: must be a positive number")

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


__all__ = ["Options"]
