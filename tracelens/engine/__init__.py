"""Engines that run the per-rank part of an analysis where the data is and reduce it across ranks.

- `local` (default): a pool of worker interpreters on this machine (`tracelens.engine.local`).
- `dask`: tasks on a Dask cluster, Parquet on shared storage (`tracelens.engine.dask_engine`).

Both produce a `StagedTables` (metadata; events read lazily) and a `Staged` (per-rank results reduced), which
`tracelens.run_analysis.Analysis` reads in place of one all-ranks events table.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tracelens.engine.local import Staged, StagedTables, load_staged
from tracelens.errors import BadInputError

#: "memory" is the one-table path of `tracelens.loader.load_tables` (all events of all ranks in memory).
ENGINES = ("local", "dask", "memory")


def load_with_engine(path: str | Path, options) -> tuple[object, Staged | None]:
    """Run the per-rank part of an analysis with `options.engine` ("local" when None) and reduce it;
    `options` is a `tracelens.run_analysis.Options`. Returns (tables, staged); staged is None for a single
    trace read with --no-cache (then tables is the loader's one-rank `Tables`)."""
    engine = options.engine or "local"
    if engine == "local":
        if options.scheduler:
            raise BadInputError("--scheduler needs --engine dask")
        if options.no_cache and _single_trace(path, options.rank_filter):
            # one rank, nothing cached: the one-table path holds one rank too, without Parquet round trips
            from tracelens.loader import load_tables

            tables = load_tables(
                path,
                no_cache=True,
                progress=options.progress,
                salvage=options.salvage,
                ranks=options.rank_filter,
            )
            return tables, None
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


def _single_trace(path: str | Path, ranks) -> bool:
    from tracelens.discover import discover
    from tracelens.ingest.sniff import KINETO

    return sum(f.fmt == KINETO for f in discover(Path(path).expanduser(), ranks)) == 1


def events_of(analysis, ranks) -> pa.Table:
    """Events of only these ranks of an analysis: read from the cache per rank with the staged engines
    (the all-ranks table is never built), filtered from the one table otherwise."""
    tables = analysis.tables
    if hasattr(tables, "events_of"):
        return tables.events_of(ranks)
    ev = tables.events
    return ev.filter(
        pc.is_in(ev.column("rank"), value_set=pa.array(sorted({int(r) for r in ranks}), pa.int32()))
    )


def top_operations(analysis, top: int = 15) -> tuple[str, list[dict]]:
    """The report's top kernels (or CPU ops on a CPU-only run) by total time over all ranks, as
    `tracelens.report.figures.top_operations(analysis.events)` gives, from the staged per-rank totals when
    there are (without reading every event)."""
    staged = getattr(analysis, "staged", None)
    if staged is None or staged.ops is None:
        from tracelens.report.figures import top_operations as from_events

        return from_events(analysis.events, top)
    from tracelens.report.figures import _r

    ops = staged.ops
    for k in ("kernel", "cpu_op"):
        sel = ops.filter(pc.equal(ops.column("kind"), k))
        if sel.num_rows:
            break
    else:
        return "", []
    agg = sel.group_by("name", use_threads=False).aggregate([("dur_ns", "sum"), ("calls", "sum")])
    agg = agg.sort_by([("dur_ns_sum", "descending")]).slice(0, top)
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


__all__ = [
    "ENGINES",
    "Staged",
    "StagedTables",
    "events_of",
    "load_staged",
    "load_with_engine",
    "top_operations",
]
