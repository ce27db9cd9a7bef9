"""collectives._agree (integer codes, distinct counts without a sort) against its definition in pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tracelens.analyze.comm import collectives as C
from tracelens.engine import kept as engine_kept


def truth(coll: pd.DataFrame) -> bool:
    if coll["instance"].isna().any() or coll["op"].isna().any():
        return False
    if (coll.groupby("instance")["op"].nunique() > 1).any():
        return False
    kind = coll["op"].astype(str).where(coll["seq"].isna(), "collectives")
    n = coll.assign(kind=kind).groupby(["group_key", "kind", "rank"]).size()
    return bool((n.groupby(level=[0, 1]).nunique() <= 1).all())


@pytest.mark.parametrize("seed", range(40))
def test_agree_matches_pandas(seed):
    rng = np.random.default_rng(seed)
    ranks, calls = int(rng.integers(2, 9)), int(rng.integers(1, 40))
    rows = []
    for inst in range(calls):
        op = str(rng.choice(["allreduce", "allgather", "broadcast"]))
        g = str(rng.choice(["g0", "g1"]))
        for r in range(ranks):
            rows.append((inst * 7 + 3, op, r, inst if seed % 2 else None, g))
    df = pd.DataFrame(rows, columns=["instance", "op", "rank", "seq", "group_key"])
    if seed % 3 == 0:  # a rank issuing another op in one instance
        df.loc[int(rng.integers(len(df))), "op"] = "reduce_scatter"
    if seed % 5 == 0:  # a rank missing a call
        df = df.drop(index=int(rng.integers(len(df))))
    if seed % 7 == 0:  # an op named like the kind
        df.loc[0, "op"] = "collectives"
    assert C._agree(df) == truth(df)


def _codes(df: pd.DataFrame) -> tuple:
    """What match_with_findings hands `_agree`: codes of the op values and of the group keys' text."""
    op_c, op_words = C._per_distinct_codes(lambda v: v, df["op"])
    gk_c, _ = C._per_distinct_codes(lambda v: v, df["group_key"].astype(str))
    return op_c, op_words, gk_c


@pytest.mark.parametrize("seed", range(40))
def test_agree_with_given_codes_matches_pandas(seed):
    """`_agree` on the codes match_with_findings already has gives the same answer as coding the strings."""
    rng = np.random.default_rng(seed)
    ranks, calls = int(rng.integers(2, 9)), int(rng.integers(1, 40))
    rows = []
    for inst in range(calls):
        op = str(rng.choice(["allreduce", "allgather", "broadcast"]))
        g = str(rng.choice(["pg:0", "pg:1", "r:0,1"]))
        for r in range(ranks):
            rows.append((inst * 7 + 3, op, r, inst if seed % 2 else None, g))
    df = pd.DataFrame(rows, columns=["instance", "op", "rank", "seq", "group_key"])
    if seed % 3 == 0:
        df.loc[int(rng.integers(len(df))), "op"] = "reduce_scatter"
    if seed % 5 == 0:
        df = df.drop(index=int(rng.integers(len(df))))
    if seed % 7 == 0:
        df.loc[df.index[0], "op"] = "collectives"
    if seed % 11 == 0:  # a group key that differs from another only in one rank's rows
        df.loc[df["rank"] == 0, "group_key"] = "pg:2"
    assert C._agree(df, _codes(df)) == C._agree(df) == truth(df)


def test_mismatches_with_codes_on_real_runs():
    """match_with_findings (codes handed to `_agree`) finds what `_mismatches` finds on its own."""
    from pathlib import Path

    from tracelens.run_analysis import Options, analyze_run

    root = Path(__file__).parents[2] / "sample_traces"
    for name in ("qwen35-27b-seq4k-tp2pp2dp2-straggler-skew", "cpu-gloo-4rank-hang", "cpu-gloo-4rank"):
        a = analyze_run(root / name, Options(no_cache=True))
        df, findings = C.match_with_findings(engine_kept.cross_collectives(a.run.stages), a.metadata)
        assert findings == C._mismatches(df)
