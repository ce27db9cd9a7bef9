"""Dask as an executor: per-rank tasks on a Dask cluster through `Client.get_executor()`.

The tasks are the same plain functions the local pool runs (`tracelens.engine.tasks.process_rank`); the
client then reads the small stage files and reduces them as for a local run, so both give the same
analysis. Workers read the traces and write the cache at the paths the client sees: on a multi-machine
cluster the cache (`--cache-dir` / `$TRACELENS_CACHE_DIR`) must be on storage shared by the client and every
worker. Needs the optional extra `dask[distributed]`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any

from tracelens.errors import BadInputError


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as err:
        raise BadInputError(
            "--engine dask needs Dask: pip install -e '.[dask]' in the tracelens checkout (or 'dask[distributed]')"
        ) from err
    return distributed


@contextmanager
def dask_executor(scheduler: str | None = None, n_workers: int | None = None) -> Iterator[Executor]:
    """An executor on the Dask cluster at `scheduler` (an address such as `tcp://host:8786`), or on a
    LocalCluster of `n_workers` single-threaded worker processes (default: the CPU count) when None."""
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
        ex: Executor = client.get_executor(pure=False)
        yield ex
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


__all__ = ["dask_executor"]
