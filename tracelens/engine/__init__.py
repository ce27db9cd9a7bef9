"""Where per-rank work runs: plain per-rank task functions (`tasks`) on an executor (`executor`).

- `executor.local_executor` (default): worker interpreters on this machine, or this process for one task.
- `dask_engine.dask_executor`: a Dask cluster's `Client.get_executor()`.

`stage` computes one rank's stage, `reduce` concatenates the stages of all ranks. `tracelens.run.load_run`
is the only caller; nothing here imports upward.
"""

#: Names accepted by `--engine`.
ENGINES = ("local", "dask")
