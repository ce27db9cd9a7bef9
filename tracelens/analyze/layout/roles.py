"""What each collective does, as evidence of the axis its group belongs to when the trace does not say which
group ran it (gloo, and any trace without `record_param_comms`).

The tensors a collective moves tell its job (their shapes are in the c10d op's `Input Dims`, recorded with
`record_shapes=True`):

- *activations*: tensor parallelism reduces the partial outputs of a row-parallel matmul (DTensor's
  `RowwiseParallel`, Megatron's `RowParallelLinear`) or gathers / scatters activations along the sequence:
  the tensor has the activation's shape, two or more dimensions ([batch, seq, hidden] or [tokens, hidden]),
  and the forward pass issues it (a hand-written data-parallel loop that all-reduces 2-D gradients after the
  backward is not tensor parallelism);
- *flat buffers*: gradient synchronisation works on flat 1-D buffers (DDP's buckets, FSDP's sharded
  parameters and gradients, Megatron's grad buffers), whatever the layer shapes;
- *scalars*: a loss or a norm (one element).

The members of one tensor-parallel group leave each blocking all-reduce of activations together (the
collective completes on all of them at once), forward after forward; two data-parallel replicas run their
forward passes independently and drift apart. `coincidence` measures that: for a candidate family of
groups, how far the members' completion times of the k-th activation all-reduce of a step scatter around
their typical offset (so that a constant clock offset between hosts does not count), relative to the time
between two such all-reduces.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.thresholds import DEFAULT

#: A family whose members' activation all-reduces complete within this share of the typical time between
#: two of them (the worst of the family's member pairs) is a tensor-parallel family; a rank runs at least
#: MIN_ACTIVATION_CALLS collectives of activations per step in its forward passes to count as tensor-parallel
#: (tracelens.thresholds: tp_coincidence, tp_min_activation_calls, with their reasons).
COINCIDENCE_MAX = DEFAULT.tp_coincidence
MIN_ACTIVATION_CALLS = DEFAULT.tp_min_activation_calls
#: Collectives tensor parallelism runs on activations: all-reduce (row-parallel outputs), and all-gather /
#: reduce-scatter along the sequence (sequence parallelism).
TP_OPS = ("allreduce", "allgather", "reducescatter")
#: Runs of at most this many ranks have their collectives' roles read: each rank's trace is decoded a second
#: time for the shapes (~0.1 s for a CPU rank). The traces that need it (gloo, no `record_param_comms`) come
#: from small runs; larger runs record their groups.
ROLES_MAX_RANKS = 64


def first_tensor_dims(name: str, dims_json: str | None) -> list[int] | None:
    """The shape of the first tensor a c10d collective reads (`Input Dims`: a tensor list's shapes, or a
    tensor's shape; `*_base_` / `*into_tensor*` ops take (output, input): the input)."""
    if not dims_json:
        return None
    try:
        dims = json.loads(dims_json)
    except ValueError:
        return None
    if not isinstance(dims, list) or not dims:
        return None
    arg = dims[1] if ("_base_" in name or "into_tensor" in name) and len(dims) > 1 else dims[0]
    if isinstance(arg, list) and arg and isinstance(arg[0], list):
        arg = arg[0]  # a tensor list: its first tensor
    if isinstance(arg, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in arg):
        return list(arg)
    return None


def role_of(dims: list[int] | None) -> str | None:
    """activation (>= 2 dimensions), flat (1-D, more than one element), scalar, or None (unknown)."""
    if dims is None:
        return None
    n = int(np.prod(dims)) if dims else 1
    if n <= 1:
        return "scalar"
    return "activation" if sum(1 for d in dims if d > 1) >= 2 else "flat"


@dataclass
class CollectiveRoles:
    """Per collective call of each rank whose shapes were read: rank, step, op, role, end_ns (its
    completion), in call order. `ranks_read`: the ranks whose shapes were read."""

    calls: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks_read: set[int] = field(default_factory=set)

    def activation_ranks(self, min_calls: int = MIN_ACTIVATION_CALLS) -> set[int]:
        """Ranks running at least MIN_ACTIVATION_CALLS collectives of activations per step in their forward
        passes (`forward`: outside the autograd engine's backward and before the step's last backward op;
        an all-reduce of 2-D gradients after the backward, a hand-written data parallelism, is not one)."""
        if self.calls.empty:
            return set()
        c = self.calls
        a = c[(c["role"] == "activation") & c["op"].isin(TP_OPS) & c["forward"]]
        if a.empty:
            return set()
        per = a.groupby(["rank", "step"]).size().groupby("rank").median()
        return {int(r) for r, n in per.items() if n >= min_calls}

    def summary(self) -> dict[str, Any]:
        """Calls per step by role (medians over ranks), for the layout's evidence."""
        if self.calls.empty:
            return {}
        per = self.calls.groupby(["rank", "step", "role"]).size().groupby("role").median()
        return {str(k): float(v) for k, v in per.items()}


def collective_roles(
    collectives: pa.Table, events: pa.Table, shapes_of: Callable[[int], pa.Table | None]
) -> CollectiveRoles:
    """Roles of the collective calls (`collectives`: schema.COLLECTIVES rows of the Kineto events) from the
    shapes of their c10d ops (`shapes_of(rank)`: ingest.op_shapes.OP_SHAPES of the rank's trace, or None)."""
    if collectives.num_rows == 0:
        return CollectiveRoles()
    coll = collectives.select(["rank", "op", "is_p2p", "enqueue_ns", "end_ns", "step"]).to_pandas()
    coll = coll[~coll["is_p2p"].fillna(False).astype(bool) & coll["enqueue_ns"].notna()]
    if coll.empty:
        return CollectiveRoles()
    from tracelens.analyze.core.dictcol import columns

    cols = columns(events)
    is_c10d = cols.flag("name", lambda v: int(v.startswith("c10d::")))
    rows = np.flatnonzero(is_c10d & cols.kinds("cpu_op"))
    if not rows.size:
        return CollectiveRoles()
    ops = events.select(["rank", "name", "ts_ns", "external_id"]).take(pa.array(rows)).to_pandas()
    ops["name"] = ops["name"].astype(str)
    merged = coll.merge(ops, left_on=["rank", "enqueue_ns"], right_on=["rank", "ts_ns"], how="inner")
    out = []
    read: set[int] = set()
    for r, g in merged.groupby("rank"):
        shapes = shapes_of(int(r))
        if shapes is None or shapes.num_rows == 0:
            continue
        read.add(int(r))
        dims = dict(zip(shapes.column("external_id").to_pylist(), shapes.column("input_dims").to_pylist()))
        g = g.copy()
        g["role"] = [
            role_of(first_tensor_dims(n, dims.get(e))) if pd.notna(e) else None
            for n, e in zip(g["name"], g["external_id"])
        ]
        out.append(g)
    if not out:
        return CollectiveRoles()
    calls = pd.concat(out, ignore_index=True)
    calls = calls[calls["role"].notna()].sort_values(["rank", "enqueue_ns"], kind="stable")
    calls["forward"] = _in_forward(calls, events)
    return CollectiveRoles(
        calls[["rank", "step", "op", "role", "end_ns", "forward"]].reset_index(drop=True), read
    )


def _in_forward(calls: pd.DataFrame, events: pa.Table) -> np.ndarray:
    """Per call: issued outside the autograd engine's backward ops (`autograd::engine::evaluate_function`)
    and before the last of them in its step; True for every call of a rank without such ops (no backward
    recorded: the test cannot apply)."""
    from tracelens.analyze.core.dictcol import columns

    cols = columns(events)
    bwd = np.flatnonzero(
        cols.flag("name", lambda v: int(v.startswith("autograd::engine::evaluate_function")))
        & cols.kinds("cpu_op")
    )
    out = np.ones(len(calls), bool)
    if not bwd.size:
        return out
    b = events.select(["rank", "ts_ns", "dur_ns", "step"]).take(pa.array(bwd)).to_pandas()
    b["end"] = b["ts_ns"] + b["dur_ns"]
    rank = calls["rank"].to_numpy()
    t = calls["enqueue_ns"].to_numpy(np.int64)
    step = calls["step"].to_numpy()
    for r, g in b.groupby("rank"):
        sel = np.flatnonzero(rank == r)
        if not sel.size:
            continue
        starts = g["ts_ns"].to_numpy(np.int64)
        ends = g["end"].to_numpy(np.int64)
        o = np.argsort(starts)
        starts, ends = starts[o], np.maximum.accumulate(ends[o])
        i = np.searchsorted(starts, t[sel], side="right") - 1
        inside = (i >= 0) & (ends[np.maximum(i, 0)] > t[sel])
        last = g.groupby("step")["end"].max()
        last_end = np.array([last.get(s, -1) if pd.notna(s) else -1 for s in step[sel]], np.int64)
        out[sel] = ~inside & (t[sel] < last_end)
    return out


def coincidence(roles: CollectiveRoles, groups: Sequence[Sequence[int]]) -> float | None:
    """How far the members of `groups` (one family) leave their activation all-reduces apart, relative to the
    time between two of them (module docstring): per member pair the median scatter, for the family the
    largest over its pairs (every member must leave with the others); None when no group has two members
    with such calls."""
    calls = roles.calls
    if calls.empty:
        return None
    act = calls[(calls["role"] == "activation") & calls["op"].isin(TP_OPS) & calls["step"].notna()]
    if act.empty:
        return None
    ends: dict[tuple[int, int], np.ndarray] = {
        (int(r), int(s)): g["end_ns"].to_numpy(np.int64) for (r, s), g in act.groupby(["rank", "step"])
    }
    steps = sorted({s for _, s in ends})
    scores = []
    for grp in groups:
        members = [int(x) for x in grp]
        if len(members) < 2:
            continue
        a = members[0]
        for b in members[1:]:
            deltas, gaps = [], []
            for s in steps:
                ea, eb = ends.get((a, s)), ends.get((b, s))
                if ea is None or eb is None or ea.size < 2 or ea.size != eb.size:
                    continue
                deltas.append(eb - ea)
                gaps.append(np.diff(ea))
            if not deltas:
                continue
            d = np.concatenate(deltas).astype(np.float64)
            gap = float(np.median(np.concatenate(gaps)))
            if gap <= 0:
                continue
            spread = float(np.median(np.abs(d - np.median(d))))
            scores.append(spread / gap)
    return float(max(scores)) if scores else None  # (every member must leave with the others)
