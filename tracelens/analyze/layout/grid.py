"""The rank grid (`Grid`: rank <-> (dp, pp, tp, cp)) and layouts a user gives (`--layout`, tracelens.toml).

A layout follows Megatron's ordering convention: in `order="tp-cp-dp-pp"` the first axis varies fastest,
so rank = tp + TP*(cp + CP*(dp + DP*pp)). The inference from the traces is `infer.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracelens.errors import BadConfigError

AXES = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"
#: Position of each axis inside a coordinate tuple (rank -> (dp, pp, tp, cp)).
COORD_INDEX = {"dp": 0, "pp": 1, "tp": 2, "cp": 3}

#: (dp, pp, tp, cp); entries are int, or None when unknown
Coord = tuple[int | None, int | None, int | None, int | None]


@dataclass
class Grid:
    """Parallel layout of a run. Degrees are None when unknown; `source` says where they came from."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    order: str | None = None
    source: str = "none"  # config | inferred | none
    coords: dict[int, Coord] = field(default_factory=dict)
    world_size: int | None = None
    #: Pipelines as rank lists in stage order (stage 0 first); derived from coords when not given.
    chains: list[list[int]] = field(default_factory=list)
    #: Assumptions made while inferring (for run.warnings), e.g. an axis assumed to be 1.
    notes: list[str] = field(default_factory=list)
    #: What each inferred axis rested on: basis traffic | p2p | names | remainder (docs/pipeline.md).
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)

    def stage_of(self, rank: int) -> int | None:
        """Pipeline stage of `rank`, None when unknown."""
        c = self.coords.get(int(rank))
        return None if c is None else c[1]

    def ranks_of_stage(self, stage: int) -> list[int]:
        """Ranks holding pipeline stage `stage`, ascending."""
        return sorted(r for r, c in self.coords.items() if c[1] == stage)

    @property
    def stages(self) -> list[int]:
        """Known stage indices, ascending."""
        return sorted({c[1] for c in self.coords.values() if c[1] is not None})

    def stage_lookup(self, ranks: np.ndarray) -> np.ndarray:
        """Vectorised stage_of: stage per rank in `ranks`, -1 where unknown."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if not self.coords or ranks.size == 0:
            return np.full(ranks.shape, -1, dtype=np.int64)
        hi = max(max(self.coords), int(ranks.max())) + 1
        lut = np.full(hi, -1, dtype=np.int64)
        known = [(r, c[1]) for r, c in self.coords.items() if c[1] is not None]
        if known:
            k = np.array(known, dtype=np.int64)
            lut[k[:, 0]] = k[:, 1]
        if int(ranks.min()) >= 0:
            out: np.ndarray = lut[ranks]
            return out
        out = np.full(ranks.shape, -1, dtype=np.int64)
        ok = ranks >= 0
        out[ok] = lut[ranks[ok]]
        return out

    def pipelines(self) -> list[list[int]]:
        """Every pipeline as its ranks in stage order."""
        if self.chains:
            return [list(c) for c in self.chains]
        if self.pp is None:
            return []
        groups: dict[tuple[int, int, int], dict[int, int]] = {}
        for r, (d, s, t, c) in self.coords.items():
            if s is None or d is None or t is None or c is None:
                continue
            groups.setdefault((d, t, c), {})[s] = r
        return [[g[s] for s in sorted(g)] for _, g in sorted(groups.items())]

    def to_dict(self) -> dict[str, Any]:
        """The summary.json `run.layout` record."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "cp": self.cp,
            "order": self.order,
            "source": self.source,
            **({"evidence": self.evidence} if self.source == "inferred" and self.evidence else {}),
        }


# ----- layouts given by the user --------------------------------------------------------------------


def parse_order(order: str | None) -> tuple[str, ...]:
    """Axis order, fastest first, e.g. 'tp-cp-dp-pp' -> ('tp','cp','dp','pp'); missing axes are appended in
    the default order and 'ep' (experts fold over dp) is ignored."""
    if order is None:
        return tuple(DEFAULT_ORDER.split("-"))
    toks = [t for t in re.split(r"[-_,\s]+", order.strip().lower()) if t]
    bad = [t for t in toks if t not in AXES and t != "ep"]
    if bad or not toks:
        raise BadConfigError(f"bad order '{order}': use axes tp, cp, dp, pp joined by '-', fastest first")
    toks = [t for t in toks if t != "ep"]
    if len(set(toks)) != len(toks):
        raise BadConfigError(f"bad order '{order}': an axis appears twice")
    return tuple(toks) + tuple(a for a in DEFAULT_ORDER.split("-") if a not in toks)


def parse_layout(text: str) -> dict[str, int | None]:
    """'tp=4,pp=4,dp=2,cp=1' -> {'tp': 4, 'pp': 4, 'dp': 2, 'cp': 1}; axes not named are None."""
    out: dict[str, int | None] = {a: None for a in ("tp", "pp", "dp", "cp")}
    parts = [p for p in re.split(r"[,\s]+", (text or "").strip()) if p]
    if not parts:
        raise BadConfigError("empty layout: expected e.g. tp=4,pp=4,dp=2,cp=1")
    for p in parts:
        m = re.fullmatch(r"(tp|pp|dp|cp)\s*[=:]\s*(\d+)", p.strip().lower())
        if not m:
            raise BadConfigError(f"bad layout item '{p}': expected e.g. tp=4,pp=4,dp=2,cp=1")
        if out[m.group(1)] is not None:
            raise BadConfigError(f"layout names {m.group(1)} twice")
        v = int(m.group(2))
        if v < 1:
            raise BadConfigError(f"layout {m.group(1)} must be >= 1, got {v}")
        out[m.group(1)] = v
    return out


def grid_from_layout(
    world_size: int | None,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    cp: int | None = None,
    order: str | None = DEFAULT_ORDER,
    source: str = "config",
) -> Grid:
    """Grid for a given layout; omitted tp/pp/cp are 1 and an omitted dp fills the world."""
    tp, pp, cp = tp or 1, pp or 1, cp or 1
    for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", dp)):
        if v is not None and v < 1:
            raise BadConfigError(f"{k} must be >= 1, got {v}")
    if dp is None:
        if world_size is None:
            dp = 1
        elif world_size % (tp * pp * cp):
            raise BadConfigError(f"tp*pp*cp = {tp * pp * cp} does not divide world size {world_size}")
        else:
            dp = world_size // (tp * pp * cp)
    total = tp * pp * dp * cp
    if world_size is not None and total != world_size:
        raise BadConfigError(
            f"layout tp={tp} pp={pp} dp={dp} cp={cp} covers {total} ranks, "
            f"but the run has world size {world_size}"
        )
    axes = parse_order(order)
    deg = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    r = np.arange(total, dtype=np.int64)
    cols: dict[str, np.ndarray] = {}
    stride = 1
    for a in axes:
        cols[a] = (r // stride) % deg[a]
        stride *= deg[a]
    coords: dict[int, Coord] = {
        int(i): (int(cols["dp"][i]), int(cols["pp"][i]), int(cols["tp"][i]), int(cols["cp"][i]))
        for i in range(total)
    }
    return Grid(
        tp=tp, pp=pp, dp=dp, cp=cp, order="-".join(axes), source=source, coords=coords, world_size=total
    )
