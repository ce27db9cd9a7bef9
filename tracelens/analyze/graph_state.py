"""A built dependency graph (`critical_path.Graph`) as plain arrays and a JSON value, and back: what the cache
keeps of it (`store.runs.write_graph`), so that analysing a run again replays the graph instead of building
it (at 1,024 ranks the build is ~2 s of a cached re-analysis' ~7).

The state holds the graph as `build_graph` leaves it: edges in order of their target's level, each node's
level, the node ids by level. The per-level lists (`levels`, `level_edges`) are views of those, made again
on the way back, as `critical_path._by_level` makes them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from tracelens.analyze.critical_keys import Cells
from tracelens.analyze.critical_path import Graph

#: Bump when the state's layout changes (the cache key also covers the code that builds the graph).
STATE_VERSION = 1
# (fields made again from others, or kept in the JSON value)
_DERIVED = {"levels", "level_edges"}
_SCALARS = {"origin_ns", "dropped_instances", "n_syncs", "early_instances"}
_DICTS = {"step_origin": float, "stage_of": int}  # (their values' type)


def graph_state(g: Graph) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of a graph whose levels are set (`build_graph`'s result)."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"version": STATE_VERSION, "cells": {}}
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


__all__ = ["STATE_VERSION", "graph_from_state", "graph_state"]
