"""collectives._agree (integer codes, distinct counts without a sort) against its definition in pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tracelens.analyze import collectives as C


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
