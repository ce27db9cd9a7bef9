"""Rank grid and process groups of a simulated run (Megatron-style rank order, PyTorch-style pg_config)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracelens.simulate.config import SimConfig

#: Megatron's group descriptions (parallel_state.py passes these as `group_desc` to new_group).
GROUP_DESC = {
    "dp": "DATA_PARALLEL_GROUP",
    "cp": "CONTEXT_PARALLEL_GROUP",
    "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
}
#: Creation order of the groups (Megatron creates data-parallel groups first).
GROUP_ORDER = ("dp", "cp", "tp", "pp")


@dataclass(frozen=True)
class Group:
    """One process group: PyTorch uid (`pg_name`), description and member global ranks."""

    name: str
    desc: str
    axis: str  # "world" | "dp" | "cp" | "tp" | "pp"
    ranks: tuple[int, ...]


class Layout:
    """rank <-> (dp, pp, tp, cp) coordinates and the process groups each rank belongs to."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.degrees = {"tp": cfg.tp, "cp": cfg.cp, "dp": cfg.dp, "pp": cfg.pp}
        self.order = cfg.order.split("-")
        self.world_size = cfg.world_size
        stride = 1
        self.strides = {}
        for ax in self.order:
            self.strides[ax] = stride
            stride *= self.degrees[ax]
        # grid[pp, dp, cp, tp] -> global rank
        idx = np.indices((cfg.pp, cfg.dp, cfg.cp, cfg.tp))
        self.grid = (
            idx[0] * self.strides["pp"]
            + idx[1] * self.strides["dp"]
            + idx[2] * self.strides["cp"]
            + idx[3] * self.strides["tp"]
        ).astype(np.int64)
        self.groups: list[Group] = [Group("0", "default_pg", "world", tuple(range(self.world_size)))]
        uid = 1
        for ax in GROUP_ORDER:
            if self.degrees[ax] == 1:
                continue
            axis_pos = {"pp": 0, "dp": 1, "cp": 2, "tp": 3}[ax]
            moved = np.moveaxis(self.grid, axis_pos, -1).reshape(-1, self.degrees[ax])
            for members in sorted(tuple(sorted(int(x) for x in row)) for row in moved):
                self.groups.append(Group(str(uid), GROUP_DESC[ax], ax, members))
                uid += 1
        self._rank_groups: dict[int, list[Group]] = {r: [] for r in range(self.world_size)}
        self._axis_group: dict[tuple[int, str], Group] = {}
        for g in self.groups:
            for r in g.ranks:
                self._rank_groups[r].append(g)
                self._axis_group[(r, g.axis)] = g

    def coords(self, rank: int) -> dict[str, int]:
        """{'tp', 'cp', 'dp', 'pp'} coordinates of a global rank."""
        return {ax: (rank // self.strides[ax]) % self.degrees[ax] for ax in self.order}

    def stage_ranks(self, stage: int) -> np.ndarray:
        """Global ranks of one pipeline stage, flattened in (dp, cp, tp) order."""
        return self.grid[stage].reshape(-1)

    def group_of(self, rank: int, axis: str) -> Group | None:
        """The rank's group along an axis ('world', 'tp', 'cp', 'dp', 'pp'), None when that degree is 1."""
        return self._axis_group.get((rank, axis))

    def host(self, rank: int) -> int:
        return rank // self.cfg.ranks_per_host

    def host_name(self, rank: int) -> str:
        return f"gpu-node-{self.host(rank):03d}"

    def local_device(self, rank: int) -> int:
        return rank % self.cfg.ranks_per_host

    @property
    def n_hosts(self) -> int:
        return -(-self.world_size // self.cfg.ranks_per_host)

    def pg_config(self, rank: int) -> list[dict]:
        """distributedInfo.pg_config as PyTorch writes it: only the groups this rank belongs to."""
        return [
            {
                "pg_name": g.name,
                "pg_desc": g.desc,
                "backend_config": "cuda:nccl",
                "pg_size": len(g.ranks),
                "ranks": list(g.ranks),
            }
            for g in self._rank_groups[rank]
        ]

    def spans_hosts(self, ranks) -> bool:
        """Whether a set of ranks crosses a host boundary (then NCCL uses the network, not NVLink)."""
        hosts = {int(r) // self.cfg.ranks_per_host for r in ranks}
        return len(hosts) > 1

    def to_json(self) -> dict:
        """Layout section of truth.json: degrees, order and the rank -> coordinates grid."""
        return {
            "tp": self.cfg.tp,
            "pp": self.cfg.pp,
            "dp": self.cfg.dp,
            "cp": self.cfg.cp,
            "order": self.cfg.order,
            "world_size": self.world_size,
            "ranks_per_host": self.cfg.ranks_per_host,
            "grid": [
                {"rank": r, **self.coords(r), "host": self.host(r), "host_name": self.host_name(r)}
                for r in range(self.world_size)
            ],
            "groups": [
                {"pg_name": g.name, "pg_desc": g.desc, "axis": g.axis, "ranks": list(g.ranks)}
                for g in self.groups
            ],
        }
