"""A hand-built multi-rank COLLECTIVES table with known structure, for the NCCL-input tests.

8 ranks, tp=2 x dp=2 x pp=2 (rank = tp + 2*dp + 4*pp). Every step: two tensor-parallel allreduces, an
activation send/recv stage 0 -> 1, a gradient send/recv 1 -> 0, a data-parallel reducescatter + allgather,
and a world allreduce of one float (the loss). Collective semantics hold: an instance ends on every
participant at the same time, after the last one arrived.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracelens import schema

WORLD = 8


def groups() -> dict[str, tuple[str, list[int]]]:
    """{pg_name: (desc, ranks)} of the layout."""
    g: dict[str, tuple[str, list[int]]] = {"0": ("default_pg", list(range(WORLD)))}
    n = 1
    for first in range(0, WORLD, 2):
        g[str(n)] = (f"tp_{first // 2}", [first, first + 1])
        n += 1
    for pp in range(2):
        for tp in range(2):
            g[str(n)] = (f"dp_pp{pp}_tp{tp}", [tp + 4 * pp, tp + 2 + 4 * pp])
            n += 1
    for r in range(4):
        g[str(n)] = (f"pp_{r}", [r, r + 4])
        n += 1
    return g


def _pg_of(g: dict, desc_prefix: str, rank: int) -> str:
    return next(n for n, (d, rs) in g.items() if d.startswith(desc_prefix) and rank in rs)


def build(steps: int = 3, seed: int = 0) -> pa.Table:
    """The run's COLLECTIVES table (source "kineto"), rows in program order per rank."""
    rng = np.random.default_rng(seed)
    g = groups()
    rows: list[dict] = []
    seqs: dict[str, int] = {}
    t = 1_000_000_000
    order: dict[tuple, int] = {}

    def instance(
        pg: str, op: str, dtype: str, n_in: int, n_out: int, elem: int, members: list[int], p2p=None
    ):
        nonlocal t
        arrive = {r: t + int(rng.integers(0, 200_000)) for r in members}
        end = max(arrive.values()) + 50_000 + n_in * elem // 100
        if p2p is None:
            seqs[pg] = seqs.get(pg, 0) + 1
        for r in members:
            kind = op
            peer = None
            if p2p is not None:
                src, dst = p2p
                kind = "send" if r == src else "recv"
                peer = dst if r == src else src
            key = (r, pg, kind)
            rows.append(
                {
                    "rank": r,
                    "source": "kineto",
                    "pg_name": pg,
                    "pg_desc": g[pg][0],
                    "pg_ranks": g[pg][1],
                    "group_size": len(g[pg][1]),
                    "op": kind,
                    "dtype": dtype,
                    "in_nelems": n_in,
                    "out_nelems": n_out,
                    "bytes": max(n_in, n_out) * elem,
                    "seq": seqs[pg] if p2p is None else None,
                    "order": order.get(key, 0),
                    "is_p2p": p2p is not None,
                    "peer": peer,
                    "state": "completed",
                    "enqueue_ns": arrive[r] - 30_000,
                    "start_ns": arrive[r],
                    "end_ns": end,
                    "step": step,
                }
            )
            order[key] = order.get(key, 0) + 1
        t = end + 100_000

    current = [0]
    for step in range(steps):
        current[0] = step
        for _ in range(2):
            for first in range(0, WORLD, 2):
                pg = _pg_of(g, "tp_", first)
                instance(pg, "allreduce", "BFloat16", 1 << 20, 1 << 20, 2, g[pg][1])
        for r in range(4):
            pg = _pg_of(g, "pp_", r)
            instance(pg, "p2p", "BFloat16", 1 << 18, 1 << 18, 2, [r, r + 4], p2p=(r, r + 4))
        for r in range(4):
            pg = _pg_of(g, "pp_", r)
            instance(pg, "p2p", "BFloat16", 1 << 18, 1 << 18, 2, [r, r + 4], p2p=(r + 4, r))
        for pp in range(2):
            for tp in range(2):
                pg = _pg_of(g, f"dp_pp{pp}_tp{tp}", tp + 4 * pp)
                instance(pg, "reducescatter", "Float", 1 << 21, 1 << 20, 4, g[pg][1])
                instance(pg, "allgather", "BFloat16", 1 << 20, 1 << 21, 2, g[pg][1])
        instance("0", "allreduce", "Float", 1, 1, 4, list(range(WORLD)))

    tbl = schema.table_from_rows(rows, schema.COLLECTIVES)
    return tbl.sort_by([("rank", "ascending"), ("enqueue_ns", "ascending")])


def kineto_run(out_dir, **overrides) -> pa.Table:
    """Simulate a small tp=2 x pp=2 x dp=2 run with the Kineto simulator (8-layer Qwen3.5-style model) and
    return its collectives as tracelens reads them from the written traces."""
    import json
    from pathlib import Path

    from tracelens.analyze.comm.collectives import collectives_from_events
    from tracelens.ingest import kineto
    from tracelens.models.spec import __file__ as spec_file
    from tracelens.simulate.config import SimConfig
    from tracelens.simulate.run import simulate

    preset = Path(spec_file).parent / "presets" / "qwen3.5-27b.json"
    cfg = json.loads(preset.read_text())
    text = cfg["text_config"]
    text["num_hidden_layers"] = 8
    text["layer_types"] = text["layer_types"][:8]
    params = dict(model=cfg, seq_len=512, tp=2, pp=2, dp=2, microbatches=2, steps=2, gzip=False)
    params.update(overrides)
    simulate(SimConfig(**params), out_dir)
    tables = [kineto.read(f).events for f in sorted(Path(out_dir).glob("*.pt.trace.json*"))]
    return collectives_from_events(pa.concat_tables(tables, promote_options="permissive"))
