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
        cfg = [
            {"pg_name": str(i), "pg_desc": d, "backend_config": "cuda:nccl", "pg_size": len(g), "ranks": g}
            for i, (d, g) in enumerate(groups_by_rank.get(r, []))
        ]
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
        out[r].append(
            ("DATA_PARALLEL_GROUP_WITH_CP", sorted(rank(i, p, t, j) for i in range(dp) for j in range(cp)))
        )
        out[r].append(
            ("MODEL_PARALLEL_GROUP", sorted(rank(d, i, j, c) for i in range(pp) for j in range(tp)))
        )
    return out


def schedule_ops(p: int, m: int, stage: int, schedule: str = "1f1b") -> list[tuple[str, int]]:
    """Op order of one stage: GPipe (all F then all B) or 1F1B (p-s-1 warm-up forwards)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(p - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]


def pipeline_run(
    tf: list[int],
    tb: list[int],
    m: int,
    steps: int = 1,
    schedule: str = "1f1b",
    annotate: bool = True,
    step_gap: int = 50_000,
    layers_per_stage: int = 1,
    tail_ns: int = 20_000,
) -> tuple[list[dict], dict]:
    """Rows of a one-pipeline run (rank = stage) with a dependency-driven schedule, and the bubble truth.

    Each op is one compute kernel (plus gpu_user_annotations per layer when `annotate`); a stage that
    waits for a neighbour spins in a P2P receive kernel; after its last backward each rank joins a
    world all-reduce (a collective wait until the slowest rank arrives) and runs an optimizer kernel.
    Truth per stage: window = [first op start, last op end] over all stages; bubble = window - busy.
    """
    p = len(tf)
    rows: list[dict] = []
    truth = {"bubble_ns": {s: [] for s in range(p)}, "window_ns": []}
    t0 = 0
    for st in range(steps):
        done: dict[tuple[str, int, int], int] = {}
        free = [t0] * p
        busy = [0] * p
        first = [None] * p
        orders = [schedule_ops(p, m, s, schedule) for s in range(p)]
        pos = [0] * p
        while any(pos[s] < len(orders[s]) for s in range(p)):
            progressed = False
            for s in range(p):
                if pos[s] >= len(orders[s]):
                    continue
                ph, i = orders[s][pos[s]]
                dep = (
                    None
                    if (ph == "F" and s == 0) or (ph == "B" and s == p - 1)
                    else (("F", s - 1, i) if ph == "F" else ("B", s + 1, i))
                )
                if ph == "B" and s == p - 1:
                    dep = ("F", s, i)
                if dep is not None and dep not in done:
                    continue
                ready = done.get(dep, t0) if dep else t0
                start = max(free[s], ready)
                if start > free[s] and dep is not None and dep[1] != s:
                    rows.append(
                        {
                            "rank": s,
                            "kind": "kernel",
                            "name": "ncclDevKernel_SendRecv",
                            "ts_ns": free[s],
                            "dur_ns": start - free[s],
                            "step": st,
                            "collective": "recv",
                            "src_rank": dep[1],
                            "stream": 20,
                        }
                    )
                dur = tf[s] if ph == "F" else tb[s]
                per = dur // layers_per_stage
                for k in range(layers_per_stage):
                    li = s * layers_per_stage + (k if ph == "F" else layers_per_stage - 1 - k)
                    a = start + k * per
                    rows.append(
                        {
                            "rank": s,
                            "kind": "kernel",
                            "name": f"gemm_{ph}",
                            "ts_ns": a,
                            "dur_ns": per,
                            "step": st,
                            "stream": 7,
                        }
                    )
                    if annotate:  # attention then MLP, as a transformer layer runs them
                        sfx = ".backward" if ph == "B" else ""
                        half = per // 2
                        for mod, b, d in (("self_attn", a, half), ("mlp", a + half, per - half)):
                            rows.append(
                                {
                                    "rank": s,
                                    "kind": "gpu_user_annotation",
                                    "name": f"layers.{li}.{mod}{sfx}",
                                    "ts_ns": b,
                                    "dur_ns": d,
                                    "step": st,
                                    "stream": 7,
                                }
                            )
                end = start + per * layers_per_stage
                if (ph == "F" and s < p - 1) or (ph == "B" and s > 0):
                    rows.append(
                        {
                            "rank": s,
                            "kind": "kernel",
                            "name": "ncclDevKernel_SendRecv",
                            "ts_ns": end,
                            "dur_ns": 1_000,
                            "step": st,
                            "collective": "send",
                            "dst_rank": s + 1 if ph == "F" else s - 1,
                            "stream": 21,
                        }
                    )
                done[(ph, s, i)] = end
                first[s] = start if first[s] is None else first[s]
                busy[s] += end - start
                free[s] = end
                pos[s] += 1
                progressed = True
            assert progressed, "schedule deadlock"
        w0, w1 = min(first), max(free)
        truth["window_ns"].append(w1 - w0)
        for s in range(p):
            truth["bubble_ns"][s].append(w1 - w0 - busy[s])
        # gradient-norm all-reduce: everyone waits for the last rank, then the optimizer
        for s in range(p):
            rows.append(
                {
                    "rank": s,
                    "kind": "kernel",
                    "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                    "ts_ns": free[s],
                    "dur_ns": w1 + 2_000 - free[s],
                    "step": st,
                    "collective": "allreduce",
                    "stream": 22,
                }
            )
            rows.append(
                {
                    "rank": s,
                    "kind": "kernel",
                    "name": "multi_tensor_apply_kernel",
                    "ts_ns": w1 + 2_000,
                    "dur_ns": tail_ns,
                    "step": st,
                    "stream": 7,
                }
            )
        step_end = w1 + 2_000 + tail_ns
        for s in range(p):
            rows.append(
                {
                    "rank": s,
                    "kind": "user_annotation",
                    "name": f"ProfilerStep#{st}",
                    "ts_ns": t0 - 1_000,
                    "dur_ns": step_end - t0 + 2_000,
                    "tid": 1,
                }
            )
        t0 = step_end + step_gap
    return rows, truth
