"""A built dependency graph (`critical_path.Graph`) as plain arrays and a JSON value, and back: what the cache
keeps of it (`store.runs.write_graph`), so that analysing a run again replays the graph instead of building
it (~2 s at 1,024 ranks).

The state holds the graph as `build_graph` leaves it: edges in order of their target's level, each node's
level, the node ids by level. The per-level lists (`levels`, `level_edges`) are views of those, made again
on the way back, as `critical_path._by_level` makes them. With the graph, its replay plan
(`critical_replay.ReplayPlan`, ~0.2 s to make again at 1,024 ranks): its arrays as they are, its per-level
lists as a few arrays (`plan_state`, `plan_from_state`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from tracelens.analyze.critical.critical_keys import Cells
from tracelens.analyze.critical.critical_path import Graph
from tracelens.analyze.critical.critical_replay import ReplayPlan

#: Bump when the state's layout changes (the cache key also covers the code that builds the graph).
STATE_VERSION = 2
#: Prefix of the plan's arrays among the graph's.
_PLAN = "plan."
# (the plan's fields kept as they are; `sy_ks` / `sy_ck` may be None; `levels`, `sync` and `prefix` are not)
_PLAN_ARRAYS: tuple[str, ...] = ("ks", "starts", "seg_idx", "ck", "sy_ks", "sy_ck", "by_step", "step_bounds")
_PLAN_ARRAYS += ("steps", "pos", "u_pos", "arr_pos", "fin_pos", "e_src")
# (fields made again from others, or kept in the JSON value)
_DERIVED = {"levels", "level_edges"}
_SCALARS = {"origin_ns", "dropped_instances", "n_syncs", "early_instances"}
_DICTS = {"step_origin": float, "stage_of": int}  # (their values' type)


def graph_state(g: Graph, plan: ReplayPlan | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of a graph whose levels are set (`build_graph`'s result), and of its replay plan when
    given (`replay_plan(g)`, before any replay: its `prefix` is not kept)."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"version": STATE_VERSION, "cells": {}, "plan": plan is not None}
    if plan is not None:
        arrays.update(plan_state(plan))
    for f in fields(Graph):
        v = getattr(g, f.name)
        if f.name in _DERIVED:
            continue
        if f.name in _SCALARS:
            meta[f.name] = int(v)
        elif f.name in _DICTS:
            cast = _DICTS[f.name]
            meta[f.name] = None if v is None else [[int(k), cast(x)] for k, x in v.items()]
        elif isinstance(v, Cells):
            arrays[f.name] = v.codes
            meta["cells"][f.name] = v.values.tolist()  # (str, None; a NaN goes through JSON as NaN)
        else:
            arrays[f.name] = v
    lv = g.levels
    arrays["by_level"] = np.concatenate(lv) if lv else np.empty(0, dtype=g.n_first_k.dtype)
    arrays["level_sizes"] = np.fromiter((a.size for a in lv), np.int64, len(lv))
    arrays["level_edge_sizes"] = np.fromiter((s.size for s, _ in g.level_edges), np.int64, len(g.level_edges))
    return arrays, meta


def graph_from_state(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Graph:
    """The graph `graph_state` gave (arrays, meta) of. ValueError / KeyError / TypeError on another state."""
    if meta.get("version") != STATE_VERSION:
        raise ValueError(f"graph state version {meta.get('version')!r}, not {STATE_VERSION}")
    kw: dict[str, Any] = {}
    for f in fields(Graph):
        if f.name in _DERIVED:
            continue
        if f.name in _SCALARS:
            kw[f.name] = int(meta[f.name])
        elif f.name in _DICTS:
            pairs = meta[f.name]
            cast = _DICTS[f.name]
            kw[f.name] = None if pairs is None else {int(k): cast(x) for k, x in pairs}
        elif f.name in meta["cells"]:
            values = np.empty(len(meta["cells"][f.name]), dtype=object)
            values[:] = meta["cells"][f.name]
            kw[f.name] = Cells(arrays[f.name], values)
        else:
            kw[f.name] = arrays[f.name]
    g = Graph(**kw)
    lb = np.r_[0, np.cumsum(arrays["level_sizes"])]
    eb = np.r_[0, np.cumsum(arrays["level_edge_sizes"])]
    if lb[-1] != g.n_nodes or eb[-1] != g.e_src.size or g.level_of.size != g.n_nodes:
        raise ValueError("graph state: levels do not cover the graph")
    byl = arrays["by_level"]
    g.levels = [byl[lb[i] : lb[i + 1]] for i in range(lb.size - 1)]
    g.level_edges = [(g.e_src[eb[i] : eb[i + 1]], g.e_dst[eb[i] : eb[i + 1]]) for i in range(eb.size - 1)]
    return g


def is_plan_array(name: str) -> bool:
    """Whether an array of the state is the plan's (`plan_state`)."""
    return name.startswith(_PLAN)


def plan_state(p: ReplayPlan) -> dict[str, np.ndarray]:
    """The arrays of a replay plan (names prefixed `plan.`): its array fields as they are (a None one left
    out), its levels as one row of five bounds each plus their reduceat starts one after the other, its sync
    terms as the levels that have them, their bounds and their three arrays one after the other."""
    out: dict[str, np.ndarray] = {}
    for name in _PLAN_ARRAYS:
        v = getattr(p, name)
        if v is not None:
            out[_PLAN + name] = v
    lv = p.levels
    out[_PLAN + "level_bounds"] = np.array([t[:5] for t in lv], dtype=np.int64).reshape(len(lv), 5)
    out[_PLAN + "level_start_sizes"] = np.fromiter((t[5].size for t in lv), np.int64, len(lv))
    out[_PLAN + "level_starts"] = np.concatenate([t[5] for t in lv]) if lv else np.empty(0, np.int64)
    with_sync = [i for i, s in enumerate(p.sync) if s is not None]
    out[_PLAN + "sync_levels"] = np.array(with_sync, dtype=np.int64)
    if with_sync:
        parts = [p.sync[i] for i in with_sync]
        out[_PLAN + "sync_sizes"] = np.array([s[0].size for s in parts if s is not None], dtype=np.int64)
        for j, name in enumerate(("sync_slots", "sync_x", "sync_end")):
            out[_PLAN + name] = np.concatenate([s[j] for s in parts if s is not None])
    return out


def plan_from_state(arrays: dict[str, np.ndarray]) -> ReplayPlan | None:
    """The replay plan `plan_state` gave the arrays of (None: the state has none). ValueError / KeyError on
    another state."""
    if _PLAN + "level_bounds" not in arrays:
        return None
    kw: dict[str, Any] = {name: arrays.get(_PLAN + name) for name in _PLAN_ARRAYS}
    bounds = arrays[_PLAN + "level_bounds"].tolist()
    sb = np.r_[0, np.cumsum(arrays[_PLAN + "level_start_sizes"])]
    starts = arrays[_PLAN + "level_starts"]
    if len(bounds) != sb.size - 1 or sb[-1] != starts.size:
        raise ValueError("graph state: the plan's levels do not cover its starts")
    levels = [(*b, starts[sb[i] : sb[i + 1]]) for i, b in enumerate(bounds)]
    sync: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * len(levels)
    at = arrays[_PLAN + "sync_levels"].tolist()
    if at:
        cb = np.r_[0, np.cumsum(arrays[_PLAN + "sync_sizes"])]
        cols = [arrays[_PLAN + n] for n in ("sync_slots", "sync_x", "sync_end")]
        for j, i in enumerate(at):
            c0, c1 = int(cb[j]), int(cb[j + 1])
            sync[i] = (cols[0][c0:c1], cols[1][c0:c1], cols[2][c0:c1])
    return ReplayPlan(**kw, levels=levels, sync=sync)


__all__ = [
    "STATE_VERSION",
    "graph_from_state",
    "graph_state",
    "is_plan_array",
    "plan_from_state",
    "plan_state",
]
