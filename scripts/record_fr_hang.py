"""Record a small real gloo run through torch.distributed.pipelining (or plain DDP / FSDP2) with the Flight
Recorder on, optionally with a planted hang, and write what a user would hand to tracelens.

    python scripts/record_fr_hang.py -o DIR [--world 8 --pp 4 --schedule 1f1b --dp-mode ddp]
        [--fault skip-collective|skip-send|stall --fault-rank R --fault-step S]

Output:
  DIR/traces/*.pt.trace.json.gz               Kineto trace per rank of the profiled steps (before the hang)
  DIR/flight_recorder/json/fr_trace_rank_<r>.json, DIR/flight_recorder/pickle/fr_trace_rank_<r>
  DIR/truth.json                              layout, groups, fault, culprit, what each rank did

The run: `world` gloo processes on a (pp, dp) DeviceMesh (rank = dp_index + dp * stage, mesh dims "pp" and
"dp"); each stage is a small MLP in a PipelineStage on the rank's "pp" group, driven by ScheduleGPipe or
Schedule1F1B (pp > 1), wrapped in DDP or fully_shard on the rank's "dp" group (dp > 1); every step ends with
a logging all_reduce of the loss on the world group. Steps 1-2 are profiled (CPU); the fault happens in a
later step, after the traces are written, as in a long job whose profiler window ended before it hung.

Faults (on `--fault-rank` in `--fault-step`):
  skip-collective  skips the step's logging all_reduce, then goes on (the others wait in it)
  skip-send        never issues the forward send of microbatch 1 (pipelining's stage send ops dropped once)
  stall            sleeps (`--stall-s`) before the step, as a stuck data loader does

Every rank writes its Flight Recorder dump (`_dump_fr_trace` / `_dump_fr_trace_json`, as torchfrtrace reads
them) `--dump-after-s` seconds into the fault step from a watchdog thread, or after the last step when it
finishes, then exits. The process group timeout is longer than the dump delay, so nothing times out first.
A run takes 10-20 s of two cores. Needs torch 2.13 (CPU build; the `record` extra).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

HIDDEN = 32
BATCH = 8
MICROBATCHES = 4
PROFILED = (1, 2)  # steps under the profiler (step 0 is its warm-up)
PG_TIMEOUT_S = 60  # longer than any dump delay: the dumps show the hang, not a timeout's aftermath


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _dump(torch, out: Path, rank: int) -> None:
    c10d = torch._C._distributed_c10d
    (out / "pickle").mkdir(parents=True, exist_ok=True)
    (out / "json").mkdir(parents=True, exist_ok=True)
    pkl = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    (out / "pickle" / f"fr_trace_rank_{rank}").write_bytes(pkl)
    js = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    (out / "json" / f"fr_trace_rank_{rank}.json").write_bytes(js if isinstance(js, bytes) else js.encode())


def _worker(rank: int, a: argparse.Namespace, init: str, stage_dir: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    torch.set_num_threads(1)
    torch.manual_seed(7 + rank)
    out = Path(stage_dir)
    dist.init_process_group(
        "gloo",
        init_method=init,
        rank=rank,
        world_size=a.world,
        timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
    )
    pp, dp = a.pp, a.world // a.pp
    stage, dp_idx = rank // dp, rank % dp
    pp_group = dp_group = None
    if pp > 1 and dp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "dp"))
        pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    elif pp > 1:
        pp_group = dist.group.WORLD
    else:
        dp_group = dist.new_group(list(range(a.world)), group_desc="data_parallel")
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    if dp > 1 and a.dp_mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, process_group=dp_group, static_graph=True)
    elif dp > 1 and a.dp_mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=mesh["dp"] if pp > 1 else None)  # type: ignore[possibly-undefined]
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def loss_fn(y, t):
        return ((y - t) ** 2).mean()

    sched = pipe_stage = None
    if pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        pipe_stage = PipelineStage(model, stage, pp, torch.device("cpu"), group=pp_group)
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[a.schedule]
        sched = cls(pipe_stage, MICROBATCHES, loss_fn=loss_fn)
    did: dict = {"rank": rank, "stage": stage, "dp_index": dp_idx, "pid": os.getpid(), "steps_done": 0}

    def watchdog(t_step: float) -> None:
        time.sleep(max(0.0, t_step + a.dump_after_s - time.time()))
        _dump(torch, out / "flight_recorder", rank)
        did["dumped_during_hang"] = True
        (out / f"rank{rank}.json").write_text(json.dumps(did))
        # no rank exits before every rank has dumped: an exit closes its connections, and a peer's pending
        # work would then end with an error before that peer's dump shows it waiting
        while len(list(out.glob("rank*.json"))) < a.world:
            time.sleep(0.05)
        os._exit(0)

    prof = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=PROFILED[0], active=len(PROFILED), repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(out / "traces"), use_gzip=True),
        record_shapes=True,
    )
    prof.start()
    try:
        _steps(a, torch, dist, rank, stage, pp, model, opt, sched, pipe_stage, prof, did, watchdog, loss_fn)
    except RuntimeError:  # a peer exited after every rank dumped: the watchdog ends this process
        time.sleep(3600)
    prof.stop()
    dist.barrier()
    _dump(torch, out / "flight_recorder", rank)
    (out / f"rank{rank}.json").write_text(json.dumps(did))
    dist.destroy_process_group()


def _steps(
    a, torch, dist, rank, stage, pp, model, opt, sched, pipe_stage, prof, did, watchdog, loss_fn
) -> None:
    """The training steps (and the planted fault) of one rank."""
    culprit = rank == a.fault_rank and a.fault != "none"
    x = torch.randn(BATCH, HIDDEN)
    target = torch.randn(BATCH, HIDDEN)
    for step in range(a.steps):
        if a.fault != "none" and step == a.fault_step:
            threading.Thread(target=watchdog, args=(time.time(),), daemon=True).start()
        if culprit and step == a.fault_step and a.fault == "stall":
            did["stalled_s"] = a.stall_s
            time.sleep(a.stall_s)
        if culprit and step == a.fault_step and a.fault == "skip-send" and pipe_stage is not None:
            orig = pipe_stage.get_fwd_send_ops

            def skip_once(chunk: int, _orig=orig, _step=step):
                if chunk == 1:
                    did["skipped"] = {"op": "send", "microbatch": 1, "step": _step}
                    return []
                return _orig(chunk)

            pipe_stage.get_fwd_send_ops = skip_once  # type: ignore[method-assign]
        opt.zero_grad()
        losses: list = []
        if sched is None:
            loss = loss_fn(model(x), target)
            loss.backward()
            value = loss.detach()
        elif stage == 0:
            sched.step(x)
            value = torch.zeros(())
        elif stage == pp - 1:
            sched.step(target=target, losses=losses)
            value = torch.stack(losses).mean().detach()
        else:
            sched.step()
            value = torch.zeros(())
        opt.step()
        if culprit and step == a.fault_step and a.fault == "skip-collective":
            did["skipped"] = {"op": "all_reduce", "group": "default_pg", "step": step, "why": "loss logging"}
        else:
            dist.all_reduce(value.reshape(1).clone())  # loss logging, on the world group
        did["steps_done"] = step + 1
        prof.step()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    p.add_argument("--dp-mode", choices=("ddp", "fsdp", "none"), default="ddp")
    p.add_argument("--layers", type=int, default=2, help="Linear+Tanh pairs per stage")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--fault", choices=("none", "skip-collective", "skip-send", "stall"), default="none")
    p.add_argument("--fault-rank", type=int, default=2)
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--stall-s", type=float, default=30.0)
    p.add_argument("--dump-after-s", type=float, default=4.0)
    a = p.parse_args(argv)
    if a.world % a.pp:
        p.error("--world must be a multiple of --pp")
    if a.fault_step <= PROFILED[-1] and a.fault != "none":
        p.error(f"--fault-step must come after the profiled steps {PROFILED}")
    if a.fault == "skip-send" and a.pp < 2:
        p.error("skip-send needs a pipeline (--pp >= 2)")
    import torch
    import torch.multiprocessing as mp

    out = Path(a.out)
    stage_dir = Path(tempfile.mkdtemp(prefix="tracelens-frhang-"))
    mp.spawn(_worker, args=(a, f"tcp://127.0.0.1:{_free_port()}", str(stage_dir)), nprocs=a.world, join=True)
    ranks = [json.loads((stage_dir / f"rank{r}.json").read_text()) for r in range(a.world)]
    dp = a.world // a.pp
    truth = {
        "kind": "real",
        "recorded_with": {
            "script": "scripts/record_fr_hang.py",
            "argv": sys.argv[1:] if argv is None else argv,
            "torch": torch.__version__,
            "backend": "gloo",
        },
        "world_size": a.world,
        "layout": {"tp": 1, "pp": a.pp, "dp": dp, "cp": 1},
        "schedule": a.schedule if a.pp > 1 else None,
        "dp_mode": a.dp_mode if dp > 1 else None,
        "profiled_steps": list(PROFILED),
        "fault": None if a.fault == "none" else {"kind": a.fault, "rank": a.fault_rank, "step": a.fault_step},
        "hang_culprit": None if a.fault == "none" else a.fault_rank,
        "ranks": ranks,
    }
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("traces", "flight_recorder"):
        if (stage_dir / sub).exists():
            os.replace(stage_dir / sub, out / sub)
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
