"""Group-local peers of point-to-point cpu ops that record no global peer (gloo's `c10d::send` /
`c10d::recv_`): the `peer_local` column of the events.

PyTorch records a send or receive on a gloo process group as the dispatcher op `c10d::send(Tensor[] tensors,
ProcessGroup process_group, int dst, int tag)` / `c10d::recv_(Tensor[] tensors, ProcessGroup process_group,
int src, int tag)`. With `record_shapes=True` the integer arguments appear in `Concrete Inputs` (the third
is the peer), and the peer is the rank *within* the process group (`torch.distributed.send` maps a global
`dst` through `get_group_rank` before calling the op). Which group it was is not recorded, so the value is
kept as it is (`peer_local`) and mapped to a global rank once every rank's groups and sends are known
(`tracelens.analyze.layout.p2p.resolve_peers`). NCCL's P2P records (`record_param_comms`, SendRecv kernels) carry
`Src Rank` / `Dst Rank` as global ranks and need none of this.

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.ingest.kineto.columns import null_array

#: Dispatcher ops with a group-local peer, and the index of the peer among their `Concrete Inputs`.
PEER_ARG = {"c10d::send": 2, "c10d::recv_": 2}


def _candidates(events: pa.Table) -> np.ndarray:
    """Rows that are one of PEER_ARG's cpu ops and carry neither src_rank nor dst_rank."""
    names = events.column("name").combine_chunks()
    if pa.types.is_dictionary(names.type):
        words = names.dictionary.to_pylist()
        hit = np.flatnonzero([w in PEER_ARG for w in words])
        if not hit.size:
            return np.zeros(0, np.int64)
        named = pc.is_in(names.indices, value_set=pa.array(hit, names.indices.type))
    else:
        named = pc.is_in(names, value_set=pa.array(list(PEER_ARG)))
    mask = pc.and_(
        pc.fill_null(named, False),
        pc.and_(events.column("src_rank").is_null(), events.column("dst_rank").is_null()),
    )
    return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


def _peer_of(concrete: str | None, index: int) -> int | None:
    """The integer at `index` of a `Concrete Inputs` JSON text (PyTorch writes it as a decimal string)."""
    if not concrete:
        return None
    try:
        vals = json.loads(concrete)
        v = vals[index] if isinstance(vals, list) and len(vals) > index else None
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            v = int(v)
    except (ValueError, IndexError, TypeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def peer_local_column(events: pa.Table, path: Path) -> pa.Array:
    """The `peer_local` column for `events` (one rank's, read from `path`): null except on the rows of
    PEER_ARG's ops whose `Concrete Inputs` give their peer. The file is decoded a second time for the op
    arguments (`tracelens.ingest.op_shapes`), only when such rows exist (gloo runs that send point-to-point:
    CPU traces, small); a file that cannot be decoded whole (a salvaged cut) gives nulls."""
    n = events.num_rows
    rows = _candidates(events) if n else np.zeros(0, np.int64)
    if not rows.size:
        return null_array(pa.int32(), n)
    from tracelens.ingest.op_shapes import read as read_shapes

    shapes = read_shapes(path)
    if shapes.num_rows == 0:
        return null_array(pa.int32(), n)
    peers: dict[int, int] = {}
    for ext, name, conc in zip(
        shapes.column("external_id").to_pylist(),
        shapes.column("name").to_pylist(),
        shapes.column("concrete_inputs").to_pylist(),
    ):
        i = PEER_ARG.get(name)
        if i is None or ext is None:
            continue
        p = _peer_of(conc, i)
        if p is not None:
            peers[int(ext)] = p
    ext_ids = events.column("external_id").take(pa.array(rows)).to_pylist()
    vals = np.full(n, -1, np.int64)
    for r, e in zip(rows.tolist(), ext_ids):
        if e is not None and e in peers:
            vals[r] = peers[e]
    return pa.array(vals.astype(np.int32), mask=vals < 0)
