"""The parallel layout of a run: the rank grid (rank <-> dp, pp, tp, cp) from a layout the user gives or
from the traces' evidence (process groups and their traffic, point-to-point peers, what each collective
does; names only confirm). One place owns it (docs/pipeline.md, "How the grid is inferred"):

- `grid`: `Grid`, `parse_layout`, `parse_order`, `grid_from_layout` (a given layout);
- `groups`: process groups declared and used, their families and traffic, the axis a name states;
- `p2p`: global peers of sends and receives (`resolve_peers`), chains of peers (the pipelines);
- `infer`: `infer_grid` (the evidence, in order) and `grid_for_run` (a given layout checked against it).
"""

from tracelens.analyze.layout.grid import (
    AXES,
    COORD_INDEX,
    DEFAULT_ORDER,
    Coord,
    Grid,
    grid_from_layout,
    parse_layout,
    parse_order,
)
from tracelens.analyze.layout.groups import name_axis, pg_config_distinct, pg_config_entries
from tracelens.analyze.layout.infer import grid_for_run, infer_grid
from tracelens.analyze.layout.p2p import P2P_NAMES

__all__ = [
    "AXES",
    "COORD_INDEX",
    "DEFAULT_ORDER",
    "P2P_NAMES",
    "Coord",
    "Grid",
    "grid_for_run",
    "grid_from_layout",
    "infer_grid",
    "name_axis",
    "parse_layout",
    "parse_order",
    "pg_config_distinct",
    "pg_config_entries",
]
