"""Engines that run the per-rank part of an analysis where the data is and reduce it across ranks.

- `local` (default): a pool of worker interpreters on this machine (`tracelens.engine.local`).
- `dask`: tasks on a Dask cluster, Parquet on shared storage (`tracelens.engine.dask_engine`).

Both produce a `StagedTables` (metadata; events read lazily) and a `Staged` (per-rank results reduced), which
`tracelens.run_analysis.Analysis` reads in place of one all-ranks events table.
"""

from __future__ import annotations

from pathlib import Path

from tracelens.engine.local import Staged, StagedTables, load_staged
from tracelens.errors import BadInputError

#: "memory" is the one-table path of `tracelens.loader.load_tables` (all events of all ranks in memory).
ENGINES = ("local", "dask", "memory")


def load_with_engine(path: str | Path, options) -> tuple[StagedTables, Staged]:
    """Run the per-rank part of an analysis with `options.engine` ("local" when None) and reduce it;
    `options` is a `tracelens.run_analysis.Options`."""
    engine = options.engine or "local"
    if engine == "local":
        if options.scheduler:
            raise BadInputError("--scheduler needs --engine dask")
        return load_staged(
            path,
            options.no_cache,
            options.progress,
            salvage=options.salvage,
            ranks=options.rank_filter,
        )
    if engine == "dask":
        from tracelens.engine.dask_engine import load_dask

        return load_dask(
            path,
            options.scheduler,
            options.no_cache,
            options.progress,
            salvage=options.salvage,
            ranks=options.rank_filter,
        )
    raise BadInputError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Staged", "StagedTables", "load_staged", "load_with_engine"]
