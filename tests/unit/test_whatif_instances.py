"""The what-if's per-instance transfer statistics by integer codes (whatif._Kernels) against the pandas
group-by over a frame of every collective kernel they replace (kept here as the reference), on random
graphs with a fixed seed, and on a hand-built one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tracelens.analyze.critical.whatif as W
from tracelens.analyze.critical.critical_keys import Cells


class _G:
    """The graph fields the transfer changes read (a weak-referenceable stand-in for critical_path.Graph)."""

    def __init__(self, rng: np.random.Generator, n: int, n_inst: int, nan_bytes: float) -> None:
        self.k_rank = rng.integers(0, 8, n).astype(np.int32)
        self.k_step = rng.integers(1, 4, n).astype(np.int64)
        coll = rng.random(n) < 0.6
        self.k_instance = np.where(coll, rng.integers(0, n_inst, n), -1).astype(np.int64)
        self.k_comm = coll
        ops = np.array(["nccl:all_reduce", "nccl:recv", "nccl:send", None, ""], dtype=object)
        self.k_op = Cells(rng.integers(0, ops.size, n).astype(np.int8), ops)
        groups = np.array(["pg:0", "pg:1", "pg:2", ""], dtype=object)
        self.k_group = Cells(rng.integers(0, groups.size, n).astype(np.int8), groups)
        n_ck = int((self.k_instance >= 0).sum())
        b = rng.choice([0.0, 1.0, 1000.0, 4096.0, 4097.0, 1 << 20], n_ck)
        self.ck_bytes = np.where(rng.random(n_ck) < nan_bytes, np.nan, b)
        # ties on purpose (medians of repeated values), whole and fractional ns
        self.k_transfer = np.round(rng.choice([0.0, 5.0, 10.0, 10.0, 33.5], n) * rng.integers(1, 4, n), 1)
        self.k_dur = rng.integers(1, 100, n).astype(np.float64)
        self.k_release = rng.random(n)


def _frame(g: _G) -> pd.DataFrame:  # a per-kernel pandas frame, the reference
    ck = np.flatnonzero(g.k_instance >= 0)
    return pd.DataFrame(
        {
            "k": ck,
            "inst": g.k_instance[ck],
            "rank": g.k_rank[ck],
            "op": np.array([str(v).replace("recv", "send") for v in g.k_op[ck]], dtype=object),
            "bytes": g.ck_bytes,
            "transfer": g.k_transfer[ck],
            "group": g.k_group[ck],
        }
    )


def _agg(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby("inst").agg(
        transfer=("transfer", "median"), bytes=("bytes", "first"), op=("op", "first"), n=("rank", "size")
    )


def _old_transfer_to_reference(g: _G, ranks: list[int]) -> np.ndarray:
    df = _frame(g)
    inst = _agg(df)
    inst["has"] = df.assign(has=np.isin(df["rank"].to_numpy(), ranks)).groupby("inst")["has"].any()
    sized = inst["bytes"].fillna(0) > 0
    inst["unit"] = inst["transfer"] / inst["bytes"].where(sized, 1.0)
    inst["sig"] = W._sig(inst)
    ref = inst[~inst["has"]].groupby("sig")["unit"].median()
    target = inst[inst["has"] & inst["sig"].isin(ref.index)]
    out = g.k_transfer.copy()
    if target.empty:
        return out
    ratio = (target["sig"].map(ref) / target["unit"].where(target["unit"] > 0)).clip(upper=1.0).fillna(1.0)
    r = df["inst"].map(ratio).fillna(1.0).to_numpy()
    out[df["k"].to_numpy()] = g.k_transfer[df["k"].to_numpy()] * r
    return out


def _old_group_median_bandwidth(g: _G, group: str) -> np.ndarray:
    df = _frame(g)
    df = df[df["group"] == group]
    out = g.k_transfer.copy()
    if df.empty:
        return out
    inst = _agg(df)
    sized = inst["bytes"].fillna(0) > 0
    inst["unit"] = inst["transfer"] / inst["bytes"].where(sized, 1.0)
    inst["sig"] = W._sig(inst)
    med = inst.groupby("sig")["unit"].transform("median")
    ratio = (med / inst["unit"].where(inst["unit"] > 0)).clip(upper=1.0).fillna(1.0)
    r = df["inst"].map(ratio).fillna(1.0).to_numpy()
    out[df["k"].to_numpy()] = g.k_transfer[df["k"].to_numpy()] * r
    return out


@pytest.mark.parametrize("seed", range(12))
def test_per_instance_matches_the_pandas_group_by(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = _G(rng, int(rng.integers(1, 400)), int(rng.integers(1, 60)), float(rng.choice([0.0, 0.3, 1.0])))
    got = W._Kernels(g).per_instance()  # type: ignore[arg-type]
    pd.testing.assert_frame_equal(got, _agg(_frame(g)), check_exact=True)


@pytest.mark.parametrize("seed", range(12))
def test_transfer_changes_match_the_pandas_path(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    g = _G(rng, int(rng.integers(1, 400)), int(rng.integers(1, 60)), float(rng.choice([0.0, 0.3, 1.0])))
    for ranks in ([0], [3], [1, 5, 7], [9]):
        got = W.transfer_to_reference(g, ranks).transfer  # type: ignore[arg-type]
        np.testing.assert_array_equal(got, _old_transfer_to_reference(g, ranks))
    for grp in ("pg:0", "pg:1", "pg:9"):
        got = W.group_median_bandwidth(g, grp).transfer  # type: ignore[arg-type]
        np.testing.assert_array_equal(got, _old_group_median_bandwidth(g, grp))


def test_per_instance_hand_built() -> None:
    g = _G(np.random.default_rng(0), 1, 1, 0.0)
    # kernels 0..6; instance 4 has kernels 0, 2, 5 (transfers 30, 10, 20: median 20), instance 1 has 1, 3
    # (10, 40: median 25), kernel 4 is no collective's, instance 2 has kernel 6 alone
    g.k_instance = np.array([4, 1, 4, 1, -1, 4, 2])
    g.k_rank = np.array([0, 1, 2, 3, 0, 1, 2], np.int32)
    g.k_transfer = np.array([30.0, 10.0, 10.0, 40.0, 99.0, 20.0, 7.0])
    g.k_op = Cells(np.array([0, 1, 0, 1, 0, 0, 2], np.int8), np.array(["ar", "recv", None], dtype=object))
    g.ck_bytes = np.array([np.nan, 8.0, 64.0, 16.0, 32.0, np.nan])  # per collective kernel
    inst = W._Kernels(g).per_instance()  # type: ignore[arg-type]
    assert inst.index.tolist() == [1, 2, 4]
    assert inst["transfer"].tolist() == [25.0, 7.0, 20.0]
    assert inst["bytes"].iloc[0] == 8.0 and np.isnan(inst["bytes"].iloc[1]) and inst["bytes"].iloc[2] == 64.0
    assert inst["op"].tolist() == ["send", "None", "ar"]
    assert inst["n"].tolist() == [2, 1, 3]
