"""The Dask engine: per-rank ingest and per-rank stage as Dask tasks, cross-rank reduction on the client.

Each task is the local engine's `process_rank` (ingest one trace into the run's Parquet cache unless a valid
entry exists, then write its per-rank stage files); the client then reads the small stage files and reduces
them exactly as the local engine does, so both give the same analysis. Workers read the traces and write
the cache at the paths the client sees: on a multi-machine cluster the run folder (and its `.tracelens/cache`)
must be on storage shared by the client and every worker. Needs the optional extra `dask[distributed]`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from tracelens.engine.local import Progress, Staged, StagedTables, load_staged
from tracelens.errors import BadInputError


def _run_task(task: dict) -> int:
    """Run one per-rank task inside a Dask worker."""
    from tracelens.workers import TASKS

    return TASKS[task["fn"]](**task["kw"])


def _import_distributed():
    try:
        import distributed
    except ImportError as err:
        raise BadInputError(
            "--engine dask needs Dask: pip install -e '.[dask]' in the tracelens checkout (or 'dask[distributed]')"
        ) from err
    return distributed


def dask_runner(client) -> Callable[[list[dict], Progress | None, int, int], None]:
    """A `load_staged` runner that submits each task to `client` and waits for all of them."""
    distributed = _import_distributed()

    def run(tasks: list[dict], progress: Progress | None, done: int, total: int) -> None:
        if not tasks:
            return
        keys = [f"tracelens-rank-{t['kw']['rank']}-{os.urandom(4).hex()}" for t in tasks]
        futures = client.map(_run_task, tasks, key=keys, pure=False)
        try:
            for fut in distributed.as_completed(futures):
                fut.result()  # re-raises the task's exception (TracelensError subclasses as themselves)
                done += 1
                if progress:
                    progress(done, total)
        except BaseException:
            client.cancel(futures)
            raise

    return run


def load_dask(
    path: str | Path,
    scheduler: str | None = None,
    no_cache: bool = False,
    progress: Progress | None = None,
    *,
    salvage: bool = False,
    ranks=None,
    n_workers: int | None = None,
) -> tuple[StagedTables, Staged]:
    """`load_staged` with the per-rank tasks on the Dask cluster at `scheduler` (an address such as
    `tcp://host:8786`), or on a LocalCluster of `n_workers` single-threaded worker processes (default:
    the CPU count) when `scheduler` is None."""
    distributed = _import_distributed()
    cluster = None
    try:
        if scheduler:
            client = distributed.Client(scheduler, timeout="30s")
        else:
            cluster = distributed.LocalCluster(
                n_workers=n_workers or os.cpu_count() or 1,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            client = distributed.Client(cluster)
    except OSError as err:
        raise BadInputError(f"--scheduler {scheduler}: cannot connect ({err})") from err
    try:
        return load_staged(
            path,
            no_cache,
            progress,
            salvage=salvage,
            ranks=ranks,
            runner=dask_runner(client),
            temp_cache=False,
        )
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


__all__ = ["dask_runner", "load_dask"]
