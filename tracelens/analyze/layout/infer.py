"""The rank grid inferred from the traces (`infer_grid`) and checked against a layout the user gives
(`grid_for_run`). Evidence, in this order (docs/pipeline.md, "How the grid is inferred"):

1. structure and traffic of the process groups (`groups.structural_axes`); names only label and confirm;
2. point-to-point peers (`p2p`): the chains of peers are the pipelines, their order the stages;
3. what each collective does (`roles`): all-reduces of activations inside the forward pass are tensor
   parallelism, gradient synchronisation (DDP buckets, FSDP) is data parallelism;
4. process-group names for the axes the evidence left open;
5. what is left: world_size / (product of known degrees) goes to the single unknown axis, if only one.

Contradictions (groups of mixed sizes, a P2P chain that disagrees with the pipeline groups, degrees that
do not divide the world) become LAYOUT_INCONSISTENT findings, never exceptions; an axis without evidence
stays unknown (None) rather than guessed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa

from tracelens.analyze.layout.grid import AXES, DEFAULT_ORDER, Coord, Grid, grid_from_layout
from tracelens.analyze.layout.groups import (
    collect_groups,
    groups_from_events,
    groups_from_metadata,
    name_axis,
    parse_ranks,
    pg_config_distinct,
    structural_axes,
)
from tracelens.analyze.layout.p2p import chains as p2p_chains
from tracelens.analyze.layout.p2p import p2p_edges, send_first_ranks
from tracelens.analyze.layout.roles import CollectiveRoles, coincidence
from tracelens.findings import finding
from tracelens.thresholds import DEFAULT, Thresholds


def _uniform_stride(groups: Sequence[Sequence[int]]) -> int | None:
    strides = set()
    for g in groups:
        if len(g) < 2:
            continue
        d = np.diff(np.asarray(g))
        if not (d == d[0]).all():
            return None
        strides.add(int(d[0]))
    return strides.pop() if len(strides) == 1 else None


def _distinct_ints(v: np.ndarray) -> np.ndarray:
    """np.unique of an integer array; by counting (no sort) when its values span a small range (ranks)."""
    if v.size == 0:
        return np.unique(v)
    lo, hi = int(v.min()), int(v.max())
    if hi - lo > 4 * v.size + (1 << 16):
        return np.unique(v)
    return np.flatnonzero(np.bincount((v - lo).astype(np.intp, copy=False))) + lo


def infer_grid(
    events: pa.Table | None,
    metadata: pa.Table | None,
    collectives: pa.Table | None = None,
    pg: pa.Table | None = None,
    roles: CollectiveRoles | None = None,
    thresholds: Thresholds = DEFAULT,
) -> tuple[Grid, list[dict[str, Any]]]:
    """Grid inferred from process groups (structure and traffic first, then names), P2P peers and what the
    collectives do; (Grid(source='none'), []) when nothing is known. `collectives`: Flight Recorder records,
    if any; `pg`: `groups.pg_rows(events)` when the caller has it (the run memo's); `roles`: the collectives'
    roles from their shapes (roles.py), when the traces do not say which group ran them."""
    findings: list[dict[str, Any]] = []
    notes: list[str] = []

    def inconsistent(msg: str, ranks: Iterable[int] = ()) -> None:
        findings.append(finding("LAYOUT_INCONSISTENT", "warning", msg, ranks=ranks))

    ranks_seen: set[int] = set()
    world: int | None = None
    if metadata is not None and metadata.num_rows:
        ranks_seen |= {int(r) for r in metadata.column("rank").to_pylist() if r is not None}
        ws = {int(w) for w in metadata.column("world_size").to_pylist() if w is not None}
        if len(ws) > 1:
            inconsistent(f"ranks report different world sizes {sorted(ws)}")
        world = max(ws) if ws else None
    if events is not None and events.num_rows:
        ranks_seen |= set(_distinct_ints(events.column("rank").to_numpy(zero_copy_only=False)).tolist())
    if world is None and ranks_seen:
        world = max(ranks_seen) + 1
    if world == 1:
        return grid_from_layout(1, 1, 1, 1, 1, source="inferred"), findings

    # 1. process groups: axes from their structure and traffic first (groups.py), names for the rest
    by_axis: dict[str, set[tuple[int, ...]]] = {a: set() for a in AXES}
    src, dst, first, any_p2p = p2p_edges(events)  # (once: the structure and the chains below read it)
    starters = send_first_ranks(events) if src.size else set()
    evidence = _structure(events, metadata, collectives, world, any_p2p, pg)
    for axis, ev in evidence.items():
        by_axis[axis] = ev.pop("_groups")
    declared = groups_from_metadata(metadata) + groups_from_events(events, pg)
    # 1b. what the collectives do, where no trace says which group ran them (roles.py)
    if roles is not None and "tp" not in evidence:
        chains0, _ = p2p_chains(src, dst, first, starters)
        tp_ev = _tensor_parallel(roles, declared, world, chains0, by_axis, thresholds)
        if tp_ev is not None:
            by_axis["tp"] = tp_ev.pop("_groups")
            evidence["tp"] = tp_ev
    claimed = {frozenset(g) for a in AXES if a in evidence for g in by_axis[a]}
    for desc, ranks in declared:
        named = name_axis(desc)
        # names add to axes that rest on names only (so their groups are still checked against each other),
        # never to a group the evidence already placed on an axis
        if named is None or frozenset(ranks) in claimed:
            continue
        if named not in evidence or evidence[named].get("basis") == "names":
            by_axis[named].add(ranks)
    for axis in AXES:
        if by_axis[axis] and axis not in evidence:
            evidence[axis] = {"basis": "names"}
    degree: dict[str, int | None] = {a: None for a in AXES}
    coord: dict[str, dict[int, int]] = {a: {} for a in AXES}
    strides: dict[str, int | None] = {a: None for a in AXES}
    for axis, groups in by_axis.items():
        if not groups:
            continue
        sizes = {len(g) for g in groups}
        members = [r for g in groups for r in g]
        if len(sizes) > 1:
            inconsistent(f"{axis} process groups have different sizes {sorted(sizes)}")
            continue
        if len(members) != len(set(members)):
            dup = sorted({r for r in members if members.count(r) > 1})
            inconsistent(f"{axis} process groups overlap (ranks {dup[:8]} are in two groups)", dup)
            continue
        degree[axis] = sizes.pop()
        strides[axis] = _uniform_stride(sorted(groups))
        for g in groups:
            for i, r in enumerate(g):
                coord[axis][r] = i

    # 2. P2P chains
    chains, problems = p2p_chains(src, dst, first, starters)
    for p in problems:
        inconsistent(p)
    if chains:
        sizes = {len(c) for c in chains}
        if len(sizes) > 1:
            inconsistent(f"pipelines found from P2P peers have different lengths {sorted(sizes)}")
            chains = []
    if chains:
        p2p_deg = len(chains[0])
        if degree["pp"] is not None:
            group_sets = {frozenset(g) for g in by_axis["pp"]}
            ordered = {tuple(g) for g in by_axis["pp"]}
            if degree["pp"] != p2p_deg or not {frozenset(c) for c in chains} <= group_sets:
                inconsistent(
                    f"pipeline process groups (size {degree['pp']}) disagree with the P2P chains "
                    f"(length {p2p_deg}); the P2P chains are used"
                )
            elif (
                not {tuple(c) for c in chains} <= ordered
                and not {tuple(reversed(c)) for c in chains} <= ordered
            ):
                inconsistent(
                    "stage order of the pipeline process groups differs from the P2P direction; "
                    "the P2P direction is used"
                )
        degree["pp"] = p2p_deg
        evidence["pp"] = {
            "basis": "p2p",
            "groups": len(chains),
            "size": p2p_deg,
            "stride": _uniform_stride(chains),
            "traffic": f"send/recv chains of {p2p_deg} ranks",
            **_names_of(chains, declared),
        }
        coord["pp"] = {r: i for c in chains for i, r in enumerate(c)}
        strides["pp"] = _uniform_stride(chains)
    elif degree["pp"] is None and not any_p2p and events is not None and _has_comm(events):
        degree["pp"] = 1  # communication is traced but nothing is ever sent point-to-point
        coord["pp"] = {r: 0 for r in ranks_seen}

    known = {a: d for a, d in degree.items() if d is not None}
    if not known:
        return Grid(source="none", world_size=world), findings

    # 3. the rest of the world
    prod = int(np.prod(list(known.values())))
    unknown = [a for a in AXES if degree[a] is None]
    if world is not None:
        if world % prod:
            inconsistent(f"inferred degrees {known} do not divide world size {world}")
            return Grid(source="none", world_size=world), findings
        rest = world // prod
        if rest == 1:
            for a in unknown:
                degree[a] = 1
        elif len(unknown) == 1:
            degree[unknown[0]] = rest
            evidence[unknown[0]] = {"basis": "remainder"}
        else:
            # several axes without evidence: P2P traffic means a pipeline, otherwise data parallelism, unless
            # the collectives reduce activations (tensor parallelism no group could be found for): unknown
            guess = "pp" if "pp" in unknown and any_p2p else "dp" if "dp" in unknown else None
            act = roles.activation_ranks(thresholds.tp_min_activation_calls) if roles is not None else set()
            if guess == "dp" and act and "tp" in unknown:
                guess = None
                notes.append(
                    f"ranks {sorted(act)[:8]} reduce activations (tensor parallelism) but no process group "
                    "family shows which ranks share them: tp and dp are left unknown"
                )
            elif guess == "dp" and roles is not None and roles.summary().get("flat"):
                evidence["dp"] = {
                    "basis": "roles",
                    "traffic": f"gradient synchronisation on flat buffers ({roles.summary()['flat']:.0f} per rank "
                    "and step), no all-reduce of activations",
                }
            if guess is not None:
                for a in unknown:
                    degree[a] = rest if a == guess else 1
                missing = ", ".join(a for a in unknown if a != guess)
                notes.append(
                    f"no process groups name {missing}: assumed 1, and {guess}={rest} fills the world"
                )
    all_ranks = sorted(ranks_seen | {r for a in AXES for r in coord[a]})
    for a in AXES:
        if degree[a] == 1 and not coord[a]:
            coord[a] = {r: 0 for r in all_ranks}
    # an axis known only by its degree: position among ranks that agree on every other axis
    for a in AXES:
        if degree[a] is None or coord[a] or degree[a] == 1:
            continue
        others = [b for b in AXES if b != a]
        if any(not coord[b] for b in others):
            continue
        buckets: dict[tuple[int | None, ...], list[int]] = {}
        for r in all_ranks:
            key = tuple(coord[b].get(r) for b in others)
            if None not in key:
                buckets.setdefault(key, []).append(r)
        if all(len(v) == degree[a] for v in buckets.values()):
            coord[a] = {r: i for v in buckets.values() for i, r in enumerate(sorted(v))}
            strides[a] = _uniform_stride([tuple(sorted(v)) for v in buckets.values()])

    coords: dict[int, Coord] = {
        r: (coord["dp"].get(r), coord["pp"].get(r), coord["tp"].get(r), coord["cp"].get(r)) for r in all_ranks
    }
    coords = {r: c for r, c in coords.items() if any(x is not None for x in c)}
    full = [c for c in coords.values() if None not in c]
    if len(full) != len(set(full)):
        inconsistent("two ranks share the same (dp, pp, tp, cp) coordinates")
    order, layout_coords = _infer_order(degree, coords)
    partial = sorted(r for r, c in coords.items() if None in c)
    ambiguous = sum(1 for a in AXES if (degree[a] or 1) > 1) > 1
    if order is not None and partial:
        # ranks whose groups were not all traced: their missing coordinates follow the order found
        for r in partial:
            c, lc = coords[r], layout_coords[r]
            coords[r] = (
                c[0] if c[0] is not None else lc[0],
                c[1] if c[1] is not None else lc[1],
                c[2] if c[2] is not None else lc[2],
                c[3] if c[3] is not None else lc[3],
            )
        if ambiguous:
            notes.append(
                f"coordinates of {len(partial)} rank(s) not fully covered by the traced groups follow "
                f"the order {order}"
            )
    grid = Grid(
        tp=degree["tp"],
        pp=degree["pp"],
        dp=degree["dp"],
        cp=degree["cp"],
        order=order,
        source="inferred",
        coords=coords,
        world_size=world,
        chains=chains,
        notes=notes,
        evidence={a: evidence[a] for a in AXES if a in evidence},
    )
    return grid, findings


def _structure(
    events: pa.Table | None,
    metadata: pa.Table | None,
    collectives: pa.Table | None,
    world: int | None,
    any_p2p: bool,
    pg: pa.Table | None = None,
) -> dict[str, dict[str, Any]]:
    """Axis -> evidence (with its groups under `_groups`) from the groups' structure and traffic."""
    entries, seq = pg_config_distinct(metadata)
    once = [  # (each distinct entry read once, then every entry in order: names map to groups, last wins)
        None
        if (r := parse_ranks(e.get("ranks"))) is None
        else (e.get("pg_name"), e.get("pg_desc", e.get("desc")), r)
        for e in entries
    ]
    declared = [d for i in seq if (d := once[i]) is not None]
    groups = collect_groups(declared, events, collectives, pg)
    by_axis, evidence = structural_axes(groups, world, any_p2p)
    for a, g in by_axis.items():
        evidence[a]["_groups"] = g
    return evidence


def _families(
    declared: list[tuple[str | None, tuple[int, ...]]], world: int | None
) -> list[list[tuple[int, ...]]]:
    """Families of declared groups (disjoint groups of one size and stride that together cover the world),
    the world group as a family of one group, largest groups first."""
    by_shape: dict[tuple[int, int | None], set[tuple[int, ...]]] = {}
    for _, ranks in declared:
        g = tuple(sorted(ranks))
        if len(g) < 2:
            continue
        by_shape.setdefault((len(g), _uniform_stride([g])), set()).add(g)
    out = []
    if world:
        by_shape.setdefault((world, 1), set()).add(tuple(range(world)))
    for gs in by_shape.values():
        members = [r for g in gs for r in g]
        if len(members) != len(set(members)) or (world is not None and len(members) != world):
            continue
        out.append(sorted(gs))
    return sorted(out, key=lambda f: -len(f[0]))


def _tensor_parallel(
    roles: CollectiveRoles,
    declared: list[tuple[str | None, tuple[int, ...]]],
    world: int | None,
    chains: list[list[int]],
    by_axis: dict[str, set[tuple[int, ...]]],
    thresholds: Thresholds = DEFAULT,
) -> dict[str, Any] | None:
    """Evidence for the tensor-parallel axis from the collectives' roles: every rank reduces activations in
    its forward and backward passes, and the largest family of declared groups whose members leave those
    all-reduces together (roles.coincidence <= the tp_coincidence threshold) is the tensor-parallel one. Families the
    evidence already placed (the pipelines' groups, groups with traffic of their own) are not candidates."""
    act = roles.activation_ranks(thresholds.tp_min_activation_calls)
    if not act or not world or len(act) < max(2, len(roles.ranks_read)):
        return None  # every rank read must run them: tensor parallelism spans every rank of a grid
    taken = {frozenset(c) for c in chains} | {frozenset(g) for gs in by_axis.values() for g in gs}
    best: tuple[list[tuple[int, ...]], float] | None = None
    tried: dict[str, float | None] = {}
    for fam in _families(declared, world):
        if any(frozenset(g) in taken for g in fam):
            continue
        score = coincidence(roles, fam)
        tried[f"size {len(fam[0])} stride {_uniform_stride(fam)}"] = (
            None if score is None else round(score, 3)
        )
        ok = score is not None and score <= thresholds.tp_coincidence
        if ok and score is not None and (best is None or len(fam[0]) > len(best[0][0])):
            best = (fam, score)
    if best is None:
        return None
    fam, score = best
    per = roles.summary()
    names = sorted({str(d) for d, r in declared if d and tuple(sorted(r)) in set(fam)})
    stated = {name_axis(n) for n in names} - {None}
    return {
        "_groups": set(fam),
        "basis": "roles",
        "groups": len(fam),
        "size": len(fam[0]),
        "stride": _uniform_stride(fam),
        "traffic": f"all-reduces of activations ({per.get('activation', 0):.0f} per rank and step) that the "
        f"group's members leave together (scatter {score:.2f} of the time between two)",
        "candidates": tried,
        "names": names[:3],
        "names_agree": None if not stated else stated == {"tp"},
    }


def _names_of(groups: list[list[int]], declared: list[tuple[str | None, tuple[int, ...]]]) -> dict[str, Any]:
    """`names` (up to three) of the declared process groups with exactly the ranks of `groups`, and
    `names_agree`: whether they state the pp axis (None when none states an axis)."""
    sets = {frozenset(g) for g in groups}
    names = sorted({str(d) for d, r in declared if d and frozenset(r) in sets})
    stated = {name_axis(n) for n in names} - {None}
    return {"names": names[:3], "names_agree": None if not stated else stated == {"pp"}}


def _has_comm(events: pa.Table) -> bool:
    """True when any collective or process-group activity is traced (so absent P2P means pp = 1)."""
    if bool(events.column("collective").is_valid().to_numpy(zero_copy_only=False).any()):
        return True
    names = events.column("name").combine_chunks()
    vals = names.dictionary.to_pylist() if pa.types.is_dictionary(names.type) else set(names.to_pylist())
    return any(v and (v.startswith(("c10d::", "gloo:", "nccl")) or v == "record_param_comms") for v in vals)


def _infer_order(
    degree: dict[str, int | None], coords: dict[int, Coord]
) -> tuple[str | None, dict[int, Coord]]:
    """The axis order (Megatron convention, default first) that reproduces every known coordinate, and
    that order's coordinates for all ranks ({} when no order fits)."""
    if any(degree[a] is None for a in AXES) or not coords:
        return None, {}
    total = int(np.prod(cast("list[int]", [degree[a] for a in AXES])))  # none is None (checked above)
    default = tuple(DEFAULT_ORDER.split("-"))
    candidates = [default] + [p for p in itertools.permutations(AXES) if p != default]
    for perm in candidates:
        g = grid_from_layout(
            total,
            degree["tp"],
            degree["pp"],
            degree["dp"],
            degree["cp"],
            order="-".join(perm),
            source="inferred",
        )
        if all(
            r in g.coords and all(x is None or x == y for x, y in zip(c, g.coords[r]))
            for r, c in coords.items()
        ):
            return "-".join(perm), g.coords
    return None, {}


def grid_for_run(
    events: pa.Table | None,
    metadata: pa.Table | None,
    layout: dict[str, int | None] | None = None,
    order: str | None = None,
    force: bool = False,
    collectives: pa.Table | None = None,
    pg: pa.Table | None = None,
    roles: CollectiveRoles | None = None,
    thresholds: Thresholds = DEFAULT,
) -> tuple[Grid, list[dict[str, Any]]]:
    """Grid from a user layout when given (checked against the traces' evidence), else inferred.

    A given layout is used unless direct evidence contradicts one of its degrees (STRONG_BASES: the groups'
    own traffic, the chains of point-to-point peers); then the findings use the evidence's layout and
    LAYOUT_INCONSISTENT says so (`force` keeps the given one). Evidence that only suggests (names, what the
    collectives do, the remainder of the world) never overrules what the user states; a disagreement is
    still reported. A layout given without an order is placed as the traces place it, when they do."""
    inferred, findings = infer_grid(events, metadata, collectives, pg, roles, thresholds)
    if not layout or all(v is None for v in layout.values()):
        return inferred, findings
    world = inferred.world_size
    grid = grid_from_layout(
        world,
        layout.get("tp"),
        layout.get("pp"),
        layout.get("dp"),
        layout.get("cp"),
        order=order or DEFAULT_ORDER,
        source="config",
    )
    if inferred.source != "inferred":
        return grid, findings
    diff = [a for a in AXES if getattr(inferred, a) is not None and getattr(inferred, a) != getattr(grid, a)]
    if diff:
        msg = ", ".join(f"{a}={getattr(grid, a)} (traces say {getattr(inferred, a)})" for a in diff)
        strong = any(inferred.evidence.get(a, {}).get("basis") in STRONG_BASES for a in diff)
        use_traces = not force and strong and _complete(inferred)
        findings.append(
            finding(
                "LAYOUT_INCONSISTENT",
                "warning",
                f"the given layout disagrees with the traces: {msg}; "
                + _which_layout(inferred if use_traces else grid, use_traces),
                given=_layout_text(grid),
                inferred=_layout_text(inferred),
                used="inferred" if use_traces else "given",
            )
        )
        return (inferred if use_traces else grid), findings
    moved = sorted(
        r
        for r, c in inferred.coords.items()
        if r in grid.coords and any(x is not None and x != y for x, y in zip(c, grid.coords[r]))
    )
    if not moved or not _complete(inferred):
        return grid, findings
    if order is None and not force:
        # the user gave degrees, not a placement: the ranks go where the traces put them
        placed = Grid(
            tp=grid.tp,
            pp=grid.pp,
            dp=grid.dp,
            cp=grid.cp,
            order=inferred.order,
            source="config",
            coords=dict(inferred.coords),
            world_size=grid.world_size,
            chains=[list(c) for c in inferred.chains],
            notes=[f"the given layout's ranks are placed as the traces place them (order {inferred.order})"],
        )
        return placed, findings
    use_traces = not force
    findings.append(
        finding(
            "LAYOUT_INCONSISTENT",
            "warning",
            f"the given order '{grid.order}' places {len(moved)} rank(s) differently "
            f"from the traces (check --order); "
            + _which_layout(inferred if use_traces else grid, use_traces),
            ranks=moved[:16],
            given=_layout_text(grid),
            inferred=_layout_text(inferred),
            used="inferred" if use_traces else "given",
        )
    )
    return (inferred if use_traces else grid), findings


#: Evidence bases that may overrule a degree the user gives: a group's own recorded traffic and the
#: point-to-point chains are the run's communication itself; names, roles and the remainder only suggest.
STRONG_BASES = ("traffic", "p2p")


def _complete(g: Grid) -> bool:
    """Every degree known and every rank placed: a layout the findings can use."""
    return None not in (g.tp, g.pp, g.dp, g.cp) and bool(g.coords)


def _layout_text(g: Grid) -> str:
    return f"tp={g.tp},pp={g.pp},dp={g.dp},cp={g.cp}" + (f" order {g.order}" if g.order else "")


def _which_layout(g: Grid, from_traces: bool) -> str:
    """The clause of LAYOUT_INCONSISTENT saying which layout the findings use."""
    if from_traces:
        return (
            f"the findings use the traces' layout {_layout_text(g)} (the evidence; --force-layout keeps "
            f"the given one)"
        )
    return f"the findings use the given layout {_layout_text(g)}" + (
        " (--force-layout)" if g.source == "config" else ""
    )
