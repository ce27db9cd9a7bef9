"""Hand-built event/metadata tables (schema-conforming) for the topology, pipeline and composition tests."""

from __future__ import annotations

import json

import pyarrow as pa

from tracelens import schema
from tracelens._testing import events_table, table_from_rows

__all__ = ["events_table", "megatron_groups", "metadata_table"]


def metadata_table(world_size: int, groups_by_rank: dict[int, list[tuple[str, list[int]]]]) -> pa.Table:
    """METADATA table whose pg_config_json lists, per rank, the (desc, ranks) groups it belongs to."""
    rows = []
    for r in range(world_size):
        cfg = [{"pg_name": str(i), "pg_desc": d, "backend_config": "cuda:nccl", "pg_size": len(g), "ranks": g}
               for i, (d, g) in enumerate(groups_by_rank.get(r, []))]
        rows.append({"rank": r, "world_size": world_size, "pg_config_json": json.dumps(cfg)})
    return table_from_rows(rows, schema.METADATA)


def megatron_groups(tp: int, pp: int, dp: int, cp: int = 1) -> dict[int, list[tuple[str, list[int]]]]:
    """Megatron-style groups (order tp-cp-dp-pp) with Megatron's group descriptions, per member rank."""
    world = tp * pp * dp * cp

    def coord(r):
        t = r % tp
        c = (r // tp) % cp
        d = (r // (tp * cp)) % dp
        p = r // (tp * cp * dp)
        return d, p, t, c

    def rank(d, p, t, c):
        return t + tp * (c + cp * (d + dp * p))

    out: dict[int, list] = {r: [("default_pg", list(range(world)))] for r in range(world)}
    for r in range(world):
        d, p, t, c = coord(r)
        out[r].append(("TENSOR_MODEL_PARALLEL_GROUP", [rank(d, p, i, c) for i in range(tp)]))
        out[r].append(("PIPELINE_MODEL_PARALLEL_GROUP", [rank(d, i, t, c) for i in range(pp)]))
        out[r].append(("DATA_PARALLEL_GROUP", [rank(i, p, t, c) for i in range(dp)]))
        out[r].append(("CONTEXT_PARALLEL_GROUP", [rank(d, p, t, i) for i in range(cp)]))
        out[r].append(("DATA_PARALLEL_GROUP_WITH_CP",
                       sorted(rank(i, p, t, j) for i in range(dp) for j in range(cp))))
        out[r].append(("MODEL_PARALLEL_GROUP", sorted(rank(d, i, j, c) for i in range(pp) for j in range(tp))))
    return out
