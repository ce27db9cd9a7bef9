"""What collectives do (analyze/layout/roles.py) and the K/V widths a rank computes (analyze/efficiency/kv_heads.py), on
hand-built events and shapes whose answers are worked out below."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest
from pipeline_tables import metadata_table

from tracelens._testing import events_table
from tracelens.analyze.efficiency.kv_heads import KVWidths, kv_evidence, projection_widths
from tracelens.analyze.layout.infer import infer_grid
from tracelens.analyze.layout.roles import CollectiveRoles, coincidence, first_tensor_dims, role_of
from tracelens.ingest.op_shapes import OP_SHAPES


def test_first_tensor_and_role():
    assert first_tensor_dims("c10d::allreduce_", json.dumps([[[4, 64, 256]], [], []])) == [4, 64, 256]
    assert first_tensor_dims("c10d::_allgather_base_", json.dumps([[65664], [16416], []])) == [16416]
    assert role_of([4, 64, 256]) == "activation"
    assert role_of([278912]) == "flat"  # a DDP bucket
    assert role_of([1]) == "scalar" and role_of(None) is None
    assert role_of([1, 4096]) == "flat"  # one real dimension


def _roles(ends: dict[int, list[int]], steps: int = 2) -> CollectiveRoles:
    rows = []
    for r, es in ends.items():
        for s in range(steps):
            for e in es:
                rows.append({"rank": r, "step": s, "op": "allreduce", "role": "activation",
                             "end_ns": s * 10**6 + e, "forward": True})  # fmt: skip
    return CollectiveRoles(pd.DataFrame(rows), set(ends))


def test_coincidence_tells_the_group_that_leaves_together():
    # ranks 0,1 and 2,3 leave each all-reduce within 1 us of each other (gap 1,000 us between two); ranks 0
    # and 2 drift apart by ~300-700 us
    base = [1000, 2000, 3000, 4000]
    drift = [1300, 2700, 3400, 4600]
    roles = _roles({0: base, 1: [e + 1 for e in base], 2: drift, 3: [e + 1 for e in drift]})
    tight = coincidence(roles, [(0, 1), (2, 3)])
    loose = coincidence(roles, [(0, 2), (1, 3)])
    assert tight == pytest.approx(0.0, abs=1e-9)
    # deltas 300, 700, 400, 600 around their median 500: |.| = 200,200,100,100 -> median 150 over gap 1000
    assert loose == pytest.approx(0.15)
    # a constant clock offset between hosts does not count
    assert coincidence(_roles({0: base, 1: [e + 5000 for e in base]}), [(0, 1)]) == pytest.approx(0.0)


def test_tensor_parallel_family_chosen_from_the_roles():
    # 4 ranks, DeviceMesh (dp=2, tp=2) named without axes: groups [0,1], [2,3] and [0,2], [1,3]
    groups = {r: [("default_pg", [0, 1, 2, 3]), ("undefined", [0, 1] if r < 2 else [2, 3]),
                  ("undefined", [0, 2] if r % 2 == 0 else [1, 3])] for r in range(4)}  # fmt: skip
    md = metadata_table(4, groups)
    base = [1000, 2000, 3000, 4000]
    # the other replica drifts by more than the time between two all-reduces, as independent forwards do
    other = [1000, 3500, 3200, 6600]
    roles = _roles({0: base, 1: base, 2: other, 3: other})
    grid, findings = infer_grid(events_table([]), md, roles=roles)
    assert (grid.tp, grid.dp, grid.pp, grid.cp) == (2, 2, 1, 1) and not findings
    assert grid.evidence["tp"]["basis"] == "roles" and grid.evidence["tp"]["stride"] == 1
    assert grid.coords[1][2] == 1 and grid.coords[2][0] == 1  # rank 1: tp 1; rank 2: dp 1
    # activations reduced, but no family leaves them together: tp and dp unknown, never guessed
    roles = _roles({0: base, 1: other, 2: [1000, 4400, 4900, 8000], 3: [3000, 3300, 7100, 7200]})
    grid, _ = infer_grid(events_table([]), md, roles=roles)
    assert grid.tp is None and grid.dp is None


def _shapes(rows: list[tuple[int, str, list]]) -> pa.Table:
    return pa.table(
        {
            "external_id": [r[0] for r in rows],
            "name": [r[1] for r in rows],
            "input_dims": [json.dumps(r[2]) for r in rows],
            "input_types": [None] * len(rows),
            "concrete_inputs": [None] * len(rows),
        },
        schema=OP_SHAPES,
    )


def test_kv_widths_from_annotated_projections():
    # tp=8 with 4 KV heads of 32: the exact share is 16; the rank computes a whole head (32). A DTensor k_proj
    # records the global matmul (128 wide) around the local one (32): the narrower is the rank's.
    ev = events_table(
        [
            {"rank": 0, "kind": "user_annotation", "name": "model.layers.0.self_attn.k_proj", "tid": 1,
             "ts_ns": 100, "dur_ns": 50},
            {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "tid": 1, "ts_ns": 110, "dur_ns": 30, "external_id": 1},
            {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "tid": 1, "ts_ns": 115, "dur_ns": 10, "external_id": 2},
            {"rank": 0, "kind": "user_annotation", "name": "model.layers.0.self_attn.v_proj", "tid": 1,
             "ts_ns": 200, "dur_ns": 50},
            {"rank": 0, "kind": "cpu_op", "name": "aten::linear", "tid": 1, "ts_ns": 210, "dur_ns": 10,
             "external_id": 3},
        ]
    )  # fmt: skip
    shapes = _shapes([(1, "aten::mm", [[256, 256], [256, 128]]), (2, "aten::mm", [[256, 256], [256, 32]]),
                      (3, "aten::linear", [[4, 64, 256], [32, 256], []])])  # fmt: skip
    w = projection_widths(0, ev, shapes)
    assert (w.k, w.v, w.qkv) == (32, 32, None)
    ev_ = kv_evidence(w, n_heads=8, n_kv=4, head_dim=32, tp=8, hidden=256)
    assert ev_["exact_width"] == 16 and ev_["factor"] == 2.0
    assert ev_["extra_kv_weight_elements_per_layer"] == 2 * 16 * 256
    # tp=4: the share is a whole head, as computed: no excess
    assert kv_evidence(KVWidths(0, 32, 32, None, ""), 8, 4, 32, 4, 256)["factor"] == 1.0
    # a fused QKV projection: q 8*32/8 = 32 plus K and V of 32 each
    assert kv_evidence(KVWidths(0, None, None, 96, ""), 8, 4, 32, 8, 256)["kv_width"] == 32
