"""`tracelens ingest`: write a run's Arrow tables as Parquet (events, memory, metadata)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from tracelens._app import app

OUTPUTS = ("events.parquet", "memory.parquet", "metadata.parquet")


def nullable_ints(table):
    """`table` with pandas metadata naming pandas' nullable integer dtypes (`Int32`, `Int64`) for its
    integer columns: `pd.read_parquet` (and `pq.read_table(...).to_pandas()`) then reads a column with
    nulls as integers with `<NA>` (step 2, not 2.0), as every integer column always, whether or not this
    run's values hold a null. Readers that ignore pandas metadata (polars, DuckDB, Arrow) see the Arrow
    types, which are unchanged."""
    import pandas as pd
    import pyarrow as pa

    nullable = {
        pa.int8(): pd.Int8Dtype(),
        pa.int16(): pd.Int16Dtype(),
        pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(),
        pa.uint8(): pd.UInt8Dtype(),
        pa.uint16(): pd.UInt16Dtype(),
        pa.uint32(): pd.UInt32Dtype(),
        pa.uint64(): pd.UInt64Dtype(),
    }
    empty = table.slice(0, 0).to_pandas(types_mapper=nullable.get)
    meta = pa.Schema.from_pandas(empty, preserve_index=False).metadata[b"pandas"]
    return table.replace_schema_metadata({**(table.schema.metadata or {}), b"pandas": meta})


def _write_zstd(table: object, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(nullable_ints(table), path, compression="zstd")


@app.command("ingest")
def ingest(
    run_dir: Annotated[
        Path, typer.Argument(help="Run folder (searched recursively) or a single trace file.")
    ],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Folder for events.parquet, memory.parquet, metadata.parquet.")
    ],
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Parse the traces again; do not read or write the cache.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite existing Parquet files in the output folder.")
    ] = False,
    workers: Annotated[
        int, typer.Option("--workers", help="Ingest processes (0 = one per CPU, at most one per rank).")
    ] = 0,
) -> None:
    """Parse every rank's Kineto trace into Parquet tables (schemas in tracelens/schema.py)."""
    from rich.progress import Progress

    from tracelens.errors import BadInputError
    from tracelens.run import load_tables
    from tracelens.store.atomic import write_atomic

    if out.exists() and not out.is_dir():
        raise BadInputError(f"{out} exists and is not a folder")
    from tracelens.outputs import guard_outputs

    guard_outputs([out / n for n in OUTPUTS], [run_dir], force=True)  # (existing tables: below)
    existing = [out / n for n in OUTPUTS if (out / n).exists()]
    if existing and not force:
        raise BadInputError(f"{existing[0]} exists; use --force to overwrite it")
    with Progress(transient=True) as progress:
        task = progress.add_task("reading traces", total=None)

        def tick(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        tables = load_tables(run_dir, no_cache=no_cache, progress=tick, workers=workers or None)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, table in zip(OUTPUTS, (tables.events, tables.memory, tables.metadata)):
            write_atomic(out / name, functools.partial(_write_zstd, table))
    except OSError as err:
        raise BadInputError(f"{out}: cannot write ({err.strerror or err})") from None
    ranks = tables.metadata.column("rank").to_pylist()
    typer.echo(
        f"{len(ranks)} rank(s), {tables.events.num_rows:,} events, {tables.memory.num_rows:,} memory records "
        f"-> {out}/{{{','.join(OUTPUTS)}}}"
    )
