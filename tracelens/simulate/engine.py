"""Joint multi-rank discrete-event schedule.

All ranks of all stages are simulated together, one step at a time. Each stage runs its program
(program.py); the state of its ranks (compute stream, CPU, per-axis communication streams) is held in
numpy arrays over the stage's ranks, shaped (dp, cp, tp), so one op advances every rank of the stage at
once. Semantics:

- A compute kernel starts when its launch has reached the GPU and the compute stream is free.
- A blocking collective starts on each rank at its arrival (the compute stream reaching it); it ends on
  every rank at (latest arrival in the group) + transfer time, so early arrivals wait inside the kernel.
- Asynchronous collectives (backward TP input-gradient all-reduce, DP gradient reduce-scatter) run on
  their own stream and are joined later by a stream wait.
- P2P: the sender's kernel starts when its data is ready and does not block the sender's compute; the
  receiver's compute waits for the receive, which ends at max(send start, receive start) + transfer;
  the matching send ends at the same time (a rendezvous).
- The step ends with a world all-reduce (gradient norm) that every rank joins, then the optimizer.

The scheduler runs each stage until it blocks on a receive whose send is not posted yet, and loops over
stages; a blocked loop with no progress is a bug (raised, never silent).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracelens.simulate import costs as C
from tracelens.simulate.config import SimConfig
from tracelens.simulate.layout import Layout
from tracelens.simulate.program import ASYNC, COLL, COMPUTE, RECV, SEND, WAIT, WORLD, Program

JITTER_COMPUTE = 0.02  # lognormal sigma of compute kernel durations
JITTER_COMM = 0.03
LAUNCH_LATENCY_NS = 4_000  # launch -> earliest kernel start
CPU_GAP_KERNEL_NS = 9_000  # CPU time per launched kernel (op dispatch + cudaLaunchKernel)
CPU_GAP_COLL_NS = 22_000
STEP_GAP_NS = 60_000  # CPU time between the end of one ProfilerStep and the start of the next
SYNC_TAIL_NS = 12_000  # CPU returns from the end-of-step synchronisation this long after the GPU


@dataclass
class StageTiming:
    """Per-step timing of one stage: int64 ns arrays shaped (n_ops, n_ranks_in_stage)."""

    launch: np.ndarray
    start: np.ndarray  # -1 for ops without a kernel
    end: np.ndarray
    wait: np.ndarray  # pipeline wait (recv: send not yet started; world: other ranks' lateness)
    step_start: np.ndarray  # (n_ranks,) ProfilerStep window
    step_end: np.ndarray


class Engine:
    """Runs the joint schedule; `run()` returns timings[step][stage]."""

    def __init__(self, cfg: SimConfig, layout: Layout, programs: list[Program], gpu: C.GpuSpec, t0_ns: int):
        self.cfg, self.layout, self.programs, self.gpu = cfg, layout, programs, gpu
        self.t0 = t0_ns
        self.shape = (cfg.dp, cfg.cp, cfg.tp)
        self.R = cfg.dp * cfg.cp * cfg.tp
        self.ranks = [layout.stage_ranks(s) for s in range(cfg.pp)]
        ws = cfg.world_size
        self.link = np.ones(ws)
        for r, f in cfg.slow_links:
            self.link[r] = max(self.link[r], f)
        self.stall = np.zeros(ws)
        for r, ms in cfg.host_stalls:
            self.stall[r] += ms * 1e6
        self.rngs = [np.random.default_rng([cfg.seed, s]) for s in range(cfg.pp)]
        self._transfer_cache: dict = {}
        # host stalls hit right before the first forward compute launch of each step (see _exec)
        self.first_fwd = []
        for prog in programs:
            idx = [i for i, op in enumerate(prog.ops) if op.kind == COMPUTE and op.phase == "F"]
            self.first_fwd.append(idx[0] if idx else -1)

    # ---- helpers --------------------------------------------------------------------------------
    def _strag(self, stage: int, step: int) -> np.ndarray:
        f = np.ones(self.R)
        ranks = self.ranks[stage]
        for r, fac, steps in self.cfg.stragglers:
            if steps is None or step in steps:
                f[ranks == r] *= fac
        return f

    def _groupmax(self, x: np.ndarray, axis: str) -> np.ndarray:
        ax = {"dp": 0, "cp": 1, "tp": 2}[axis]
        y = x.reshape(self.shape)
        return np.broadcast_to(y.max(axis=ax, keepdims=True), self.shape).reshape(-1)

    def _transfer(self, stage: int, op) -> np.ndarray:
        """Nominal transfer time per rank of the stage for a collective op (same within a group)."""
        key = (stage, op.axis, op.coll, op.base_ns)
        hit = self._transfer_cache.get(key)
        if hit is not None:
            return hit
        ranks = self.ranks[stage]
        out = np.empty(self.R)
        for i, r in enumerate(ranks):
            if op.axis == "pp":
                peer = self.layout.grid[stage + op.peer].reshape(-1)[i]
                cross = self.layout.spans_hosts([r, peer])
                out[i] = C.p2p_ns(op.base_ns, cross, self.gpu)
            else:
                g = self.layout.group_of(int(r), op.axis)
                n = len(g.ranks) if g else 1
                cross = self.layout.spans_hosts(g.ranks) if g else False
                out[i] = C.coll_ns(op.coll, op.base_ns, n, cross, self.gpu)
        self._transfer_cache[key] = out
        return out

    # ---- main loop --------------------------------------------------------------------------------
    def run(self) -> list[list[StageTiming]]:
        cfg = self.cfg
        P = cfg.pp
        cpu_next = [
            np.full(self.R, self.t0, dtype=np.int64) + (np.arange(self.R) * 1_317) % 9_000 for _ in range(P)
        ]
        out = []
        for step in range(cfg.steps):
            out.append(self._run_step(step, cpu_next))
            cpu_next = [t.step_end + STEP_GAP_NS for t in out[-1]]
        return out

    def _run_step(self, step: int, cpu_start: list[np.ndarray]) -> list[StageTiming]:
        P, R = self.cfg.pp, self.R
        progs = self.programs
        tim = []
        st = []
        for s in range(P):
            n = len(progs[s].ops)
            launch = np.full((n, R), -1, dtype=np.int64)
            tim.append(
                StageTiming(
                    launch,
                    launch.copy(),
                    launch.copy(),
                    np.zeros((n, R), dtype=np.int64),
                    cpu_start[s].copy(),
                    cpu_start[s].copy(),
                )
            )
            cpu = cpu_start[s] + 3_000 + self.rngs[s].integers(0, 2_000, R)
            st.append(
                {
                    "c": cpu_start[s].copy(),  # compute stream cursor
                    "cpu": cpu,
                    "streams": {
                        "tp": cpu_start[s].copy(),
                        "cp": cpu_start[s].copy(),
                        "dp": cpu_start[s].copy(),
                    },
                    "send_free": cpu_start[s].copy(),  # send stream cursor
                    # sends issued, in order, whose end is not known yet: (op index, key, earliest start);
                    # the send stream runs them one after another, so only the first has a known start
                    "send_queue": [],
                    "strag": self._strag(s, step),
                    "stall": self.stall[self.ranks[s]].astype(np.int64),
                    "ptr": 0,
                }
            )
        self._timing_ref = tim
        sends: dict[tuple, tuple[int, int, np.ndarray]] = {}  # key -> (stage, op index, start array)
        world_waiting: dict[int, int] = {}
        done = [False] * P
        while not all(done):
            progressed = False
            for s in range(P):
                if done[s]:
                    continue
                while st[s]["ptr"] < len(progs[s].ops):
                    i = st[s]["ptr"]
                    op = progs[s].ops[i]
                    if op.kind == WORLD:
                        world_waiting[s] = i
                        break
                    if op.kind == RECV and op.key not in sends:
                        break
                    self._exec(s, i, op, st[s], tim[s], sends, st)
                    st[s]["ptr"] += 1
                    progressed = True
                if st[s]["ptr"] >= len(progs[s].ops):
                    done[s] = True
            if len(world_waiting) == P and all(st[s]["ptr"] == world_waiting[s] for s in range(P)):
                self._exec_world(world_waiting, st, tim)
                for s in range(P):
                    st[s]["ptr"] += 1
                world_waiting.clear()
                progressed = True
            if not progressed and not all(done):
                raise RuntimeError(
                    f"simulator deadlock in step {step}: "
                    + ", ".join(f"stage {s} at op {st[s]['ptr']}" for s in range(P))
                )
        for s in range(P):
            t = tim[s]
            gpu_end = np.maximum(st[s]["c"], np.maximum(st[s]["send_free"], st[s]["streams"]["dp"]))
            t.step_end = np.maximum(st[s]["cpu"], gpu_end) + SYNC_TAIL_NS + self.rngs[s].integers(0, 3_000, R)
        return tim

    def _launch(self, stt: dict, op, s: int) -> np.ndarray:
        """Launch time of `op` on each rank; advances the CPU by the op's dispatch cost (+ jitter)."""
        launch = stt["cpu"].copy()
        gap = CPU_GAP_COLL_NS if op.kind != COMPUTE else CPU_GAP_KERNEL_NS
        stt["cpu"] = stt["cpu"] + gap + self.rngs[s].integers(0, 2_500, self.R)
        return launch

    def _exec(self, s: int, i: int, op, stt: dict, t: StageTiming, sends: dict, all_st: list) -> None:
        rng = self.rngs[s]
        ranks = self.ranks[s]
        if op.kind == WAIT:
            stt["c"] = np.maximum(stt["c"], stt["streams"][op.axis])
            return
        launch = self._launch(stt, op, s)
        if i == self.first_fwd[s] and stt["stall"].any():
            # host stall: the CPU waited for the GPU (data loading / a sync), then stalled before launching
            stalled = np.maximum(launch, stt["c"]) + stt["stall"]
            launch = np.where(stt["stall"] > 0, stalled, launch)
            stt["cpu"] = np.maximum(stt["cpu"], launch + CPU_GAP_KERNEL_NS)
        t.launch[i] = launch
        ready = launch + LAUNCH_LATENCY_NS
        if op.kind == COMPUTE:
            dur = op.base_ns * np.exp(rng.normal(0.0, JITTER_COMPUTE, self.R)) * stt["strag"]
            start = np.maximum(stt["c"], ready)
            end = start + np.rint(dur).astype(np.int64)
            t.start[i], t.end[i] = start, end
            stt["c"] = end
            return
        xfer = self._transfer(s, op) * np.exp(rng.normal(0.0, JITTER_COMM, self.R)) * self.link[ranks]
        tail = rng.integers(0, 1500, self.R)
        if op.kind in (COLL, ASYNC):
            stream = stt["streams"][op.axis]
            arrive = np.maximum(np.maximum(stt["c"], ready), stream)
            last = self._groupmax(arrive, op.axis)
            x = self._groupmax(xfer, op.axis)
            end = last + np.rint(x).astype(np.int64) + tail
            t.start[i], t.end[i] = arrive, end
            stt["streams"][op.axis] = end
            if op.kind == COLL:
                stt["c"] = end
            return
        if op.kind == SEND:
            # the CPU enqueues the send and goes on; the send stream starts it once the previous send ended
            stt["send_queue"].append((i, op.key, np.maximum(stt["c"], ready)))
            if len(stt["send_queue"]) == 1:
                self._post_send(s, stt, sends)
            return
        if op.kind == RECV:
            src_stage, src_i, send_start = sends.pop(op.key)
            start = np.maximum(stt["c"], ready)
            peer_link = self.link[self.ranks[src_stage]]
            x = np.maximum(xfer, xfer / self.link[ranks] * peer_link)
            last = np.maximum(start, send_start)
            end = last + np.rint(x).astype(np.int64)
            t.start[i], t.end[i] = start, end + tail
            t.wait[i] = np.maximum(0, send_start - start)
            stt["c"] = end + tail
            src = all_st[src_stage]
            self._timing_ref[src_stage].end[src_i] = end + rng.integers(0, 1500, self.R)
            src["send_free"] = self._timing_ref[src_stage].end[src_i].copy()
            src["send_queue"].pop(0)
            if src["send_queue"]:
                self._post_send(src_stage, src, sends)
            return
        raise AssertionError(f"unknown op kind {op.kind}")

    def _post_send(self, s: int, stt: dict, sends: dict) -> None:
        """The first queued send of stage s starts: after its data is ready and the previous send ended."""
        i, key, earliest = stt["send_queue"][0]
        start = np.maximum(earliest, stt["send_free"])
        self._timing_ref[s].start[i] = start
        sends[key] = (s, i, start)

    def _exec_world(self, at: dict[int, int], st: list, tim: list[StageTiming]) -> None:
        arrivals = []
        for s, i in at.items():
            op = self.programs[s].ops[i]
            launch = self._launch(st[s], op, s)
            tim[s].launch[i] = launch
            arrivals.append(np.maximum(st[s]["c"], launch + LAUNCH_LATENCY_NS))
        last = max(int(a.max()) for a in arrivals)
        ws = self.cfg.world_size
        cross = self.layout.n_hosts > 1
        x = C.coll_ns("allreduce", 4.0, ws, cross, self.gpu) * float(self.link.max())
        for (s, i), arrive in zip(at.items(), arrivals):
            end = last + int(round(x)) + self.rngs[s].integers(0, 1500, self.R)
            tim[s].start[i], tim[s].end[i] = arrive, end
            tim[s].wait[i] = last - arrive
            st[s]["c"] = end
