"""One large single-rank trace: `tracelens analyze` against the parsing limit, at two sizes and two step shapes.

The traces are synthetic single-rank GPU Kineto traces written by `write_trace` (streamed, any size): each
step is a `ProfilerStep#N` window (a CPU `user_annotation` and its `gpu_user_annotation`) in which the host
thread runs cpu ops, each launching one kernel through `cudaLaunchKernel` (matched by `correlation`), with a
data-loading op at the step's start and a `cudaStreamSynchronize` at its end; the kernels run on one stream,
queued behind each other or waiting for their launch (so the GPU idle split has every cause to find). Two
shapes: `short` (500 kernels a step, as many steps as the size takes: ~1,000 at 400 MB) and `long` (20 steps,
as many kernels a step as the size takes). Kernel and op names are drawn from a few dozen realistic ones.

The reference is the parsing limit named by issue 43: a typed `msgspec` decode of the file's events into a
Struct holding only `ph`, `cat`, `name`, `ts` and `dur`. Each row runs in a fresh process; rows are
interleaved in rounds so that a busy moment of a shared machine hits every row alike; medians are reported.

    .venv/bin/python benchmarks/large_trace.py                       # 100 MB and 400 MB, both shapes
    .venv/bin/python benchmarks/large_trace.py --sizes 100,400,2000 --repeat 3 --workdir /tmp/tl-large
    .venv/bin/python benchmarks/large_trace.py --code /path/to/other/checkout   # also time another checkout

Rows: `decode` (the reference), `analyze` (`tracelens analyze TRACE -o OUT`, report.html included, on a
cold cache: a fresh `--cache-dir` each run), `load` (`tracelens.load(folder, no_cache=True)` and its events,
in a fresh process with pandas and pyarrow imported first). Peak RSS is the largest sum of the resident
memory of the process tree (sampled every 20 ms from /proc). The traces are kept in `--workdir` (default
/tmp/tracelens-large) between runs and reused when their size and shape match; `--clean` deletes them.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import run_measured  # noqa: E402 (the benchmarks' shared process-tree sampler)

KERNELS_SHORT = 500  # kernels a step in the `short` shape
STEPS_LONG = 20  # steps in the `long` shape
_PID, _TID, _STREAM = 4242, 4242, 7
_BASE_US = 5_123_543_000_000  # first timestamp, in microseconds (Kineto's clock: a large absolute value)

_KERNELS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
    "kernel__5x_cublas",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, "
    "float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>("
    "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)",
    "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, "
    "true, false, false, true, true, false>(flash::Flash_fwd_params)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
    "float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, "
    "float, float>, unsigned int, float, 4>)",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#3}::operator()() const::{lambda()#10}::operator()() const::{lambda(c10::BFloat16)#1}, "
    "at::detail::Array<char*, 2>, 4>",
    "triton_poi_fused_add_mul_silu_0",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, c10::BFloat16, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)",
]
_OPS = [
    "aten::add",
    "aten::mm",
    "aten::native_layer_norm",
    "aten::addmm",
    "aten::_flash_attention_forward",
    "aten::mean",
    "aten::copy_",
    "triton_poi_fused_add_mul_silu_0",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1",
    "aten::_softmax",
]


def _us(ns: int) -> str:
    """Kineto's microseconds with three decimals (exact ns)."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def _header() -> str:
    return (
        '{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", '
        '"totalGlobalMem": 85029158912, "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024, '
        '"maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, '
        '"numSms": 132}], "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, '
        '"cuda_runtime_version": 12040, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1790857026000000000, '
        '"traceEvents": [\n'
        f'{{"ph": "M", "name": "process_name", "pid": {_PID}, "tid": 0, "args": {{"name": "python3"}}}},\n'
        f'{{"ph": "M", "name": "thread_name", "pid": {_PID}, "tid": {_TID}, "args": {{"name": "thread {_TID}"}}}},\n'
        '{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python3"}},\n'
        '{"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},\n'
    )


def _step(
    step: int, kernels: int, t: int, corr: int, ext: int, distinct: bool = False, long_name: str = ""
) -> tuple[list[str], int, int, int]:
    """The events of one step starting at host time `t` (ns); (lines, next t, next correlation, next
    external id). Deterministic: durations follow from the kernel's index. `distinct`: every op and kernel
    name made unique (a suffix with its id); `long_name`: the first kernel of the step gets this name."""
    out = []
    step_start = t
    dl = 180_000 + (step % 7) * 10_000  # data loading at the step's start: the GPU waits on the host
    out.append(
        f'{{"ph": "X", "cat": "cpu_op", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", '
        f'"pid": {_PID}, "tid": {_TID}, "ts": {_us(t + 1_000)}, "dur": {_us(dl)}, '
        f'"args": {{"External id": {ext}, "Record function id": 0, "Ev Idx": {ext}}}}}'
    )
    ext += 1
    t += 1_000 + dl + 2_000
    gpu_free = t
    first_kernel = None
    for i in range(kernels):
        j = (i * 7 + step) % len(_KERNELS)
        cpu_dur = 9_000 + (i % 5) * 1_000
        launch = t + 2_500
        start = max(launch + 4_000, gpu_free)
        kdur = 2_000 + ((i * 2_654_435_761 + step * 97) % 21) * 1_000  # 2-22 us: some queue, some wait
        end = start + kdur
        gpu_free = end
        op, kernel = (f"{_OPS[j]}_{ext}", f"{_KERNELS[j]}_{ext}") if distinct else (_OPS[j], _KERNELS[j])
        if first_kernel is None:
            first_kernel = start
            kernel = long_name or kernel
        out.append(
            f'{{"ph": "X", "cat": "cpu_op", "name": "{op}", "pid": {_PID}, "tid": {_TID}, '
            f'"ts": {_us(t)}, "dur": {_us(cpu_dur)}, "args": {{"External id": {ext}, '
            f'"Record function id": 0, "Sequence number": {ext}, "Fwd thread id": 0, "Ev Idx": {ext}}}}}'
        )
        out.append(
            f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {_PID}, "tid": {_TID}, '
            f'"ts": {_us(launch)}, "dur": {_us(5_000)}, "args": {{"External id": {ext}, "cbid": 211, '
            f'"correlation": {corr}}}}}'
        )
        out.append(
            f'{{"ph": "X", "cat": "kernel", "name": "{kernel}", "pid": 0, "tid": {_STREAM}, '
            f'"ts": {_us(start)}, "dur": {_us(kdur)}, "args": {{"External id": {ext}, "queued": 0, '
            f'"device": 0, "context": 1, "stream": {_STREAM}, "correlation": {corr}, "registers per thread": 32, '
            f'"shared memory": 0, "grid": [{1 + i % 64}, 1, 1], "block": [128, 1, 1]}}}}'
        )
        corr += 1
        ext += 1
        t += cpu_dur + 500
    sync_end = max(t + 3_000, gpu_free + 2_000)
    out.append(
        f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": {_PID}, "tid": {_TID}, '
        f'"ts": {_us(t)}, "dur": {_us(sync_end - t)}, "args": {{"cbid": 131, "correlation": {corr}}}}}'
    )
    corr += 1
    t = sync_end + 1_000
    out.append(
        f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {_PID}, "tid": {_TID}, '
        f'"ts": {_us(step_start)}, "dur": {_us(t - step_start)}, "args": {{"External id": {ext}}}}}'
    )
    out.append(
        f'{{"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#{step}", "pid": 0, "tid": {_STREAM}, '
        f'"ts": {_us(first_kernel if first_kernel is not None else step_start)}, '
        f'"dur": {_us(max(gpu_free - (first_kernel or step_start), 1))}, "args": {{"External id": {ext}}}}}'
    )
    ext += 1
    return out, t + 4_000, corr, ext


def write_trace(
    path: Path, size_bytes: int, shape: str, distinct: bool = False, long_name_bytes: int = 0
) -> dict[str, int]:
    """Write a trace of about `size_bytes` of JSON in `shape` ("short" or "long") to `path` (through a
    temporary file, so a cut run never leaves a trace behind). Returns its steps, kernels and bytes.
    `distinct`: every op and kernel name unique; `long_name_bytes`: the first kernel of the trace named
    by a C++ template of that many characters."""
    probe = "\n".join(_step(1, 50, _BASE_US * 1000, 1, 1)[0])
    per_kernel = len(probe) / 50
    if shape == "short":
        kernels = KERNELS_SHORT
        steps = max(1, round(size_bytes / (per_kernel * kernels)))
    elif shape == "long":
        steps = STEPS_LONG
        kernels = max(1, round(size_bytes / (per_kernel * steps)))
    else:
        raise ValueError(f"shape: {shape!r} (short or long)")
    tmp = path.with_name(path.name + ".part")
    t, corr, ext = _BASE_US * 1000, 1, 1
    with open(tmp, "w", buffering=1 << 22) as fh:
        fh.write(_header())
        long_name = ("void f<" + "T, " * (long_name_bytes // 3) + "T>()") if long_name_bytes else ""
        for s in range(steps):
            lines, t, corr, ext = _step(s + 1, kernels, t, corr, ext, distinct, long_name if s == 0 else "")
            fh.write(",\n".join(lines))
            fh.write(",\n" if s + 1 < steps else "\n")
        fh.write('], "traceName": "' + path.name + '"}\n')
    tmp.replace(path)
    return {"steps": steps, "kernels_per_step": kernels, "bytes": path.stat().st_size}


_DECODE = r"""
import sys, time, resource, json
import msgspec
class Ev(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
class Trace(msgspec.Struct):
    traceEvents: list[Ev]
t0 = time.perf_counter()
with open(sys.argv[1], "rb") as fh:
    data = fh.read()
n = len(msgspec.json.decode(data, type=Trace).traceEvents)
print(json.dumps({"seconds": time.perf_counter() - t0, "events": n}))
"""

_LOAD = r"""
import sys, time, json
import pandas, pyarrow
t0 = time.perf_counter()
import tracelens
run = tracelens.load(sys.argv[1], no_cache=True)
n = len(run.events)
print(json.dumps({"seconds": time.perf_counter() - t0, "events": n}))
"""


def trace_for(work: Path, mb: int, shape: str) -> tuple[Path, dict[str, int]]:
    """The trace of `mb` MB in `shape` under `work` (one folder each, as a run folder), written if missing."""
    folder = work / f"{shape}-{mb}mb"
    path = folder / "rank0.trace.json"
    info_file = folder / "info.json"
    if path.exists() and info_file.exists():
        return path, json.loads(info_file.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    info = write_trace(path, mb * 10**6, shape)
    info_file.write_text(json.dumps(info))
    return path, info


def _measure(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """run_measured(cmd) with this environment, started in `cwd`: outside every checkout measured, since
    `python -m tracelens` puts the current folder first on sys.path."""
    old, here = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        return run_measured(cmd)
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(old)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,400", help="trace sizes in MB of JSON (comma-separated)")
    ap.add_argument("--shapes", default="short,long")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", default="decode,analyze", help="decode, analyze, analyze_no_report, load")
    ap.add_argument("--workdir", default="/tmp/tracelens-large")
    ap.add_argument(
        "--code", default=None, help="also time the tracelens checkout at this path (rows *_other)"
    )
    ap.add_argument("--json", default=None, help="also write every measurement as JSON here")
    ap.add_argument("--clean", action="store_true", help="delete the traces at the end")
    args = ap.parse_args()
    compileall.compile_dir(str(REPO / "tracelens"), quiet=1)
    codes = {"this": str(REPO)}
    if args.code:
        compileall.compile_dir(str(Path(args.code) / "tracelens"), quiet=1)
        codes["other"] = str(Path(args.code).resolve())
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    traces = {}
    for mb in (int(v) for v in args.sizes.split(",")):
        for shape in args.shapes.split(","):
            path, info = trace_for(work, mb, shape)
            traces[(mb, shape)] = (path, info)
            print(f"{path}: {info}", flush=True)
    rows = args.rows.split(",")
    results: dict[tuple[int, str, str, str], list[dict[str, float]]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="tl-large-out-", dir=work))
    try:
        for rnd in range(args.repeat):
            for (mb, shape), (path, _info) in traces.items():
                for row in rows:
                    for code, src in codes.items() if row != "decode" else [("this", str(REPO))]:
                        env = {**os.environ, "PYTHONPATH": src}
                        cache = scratch / "cache"
                        shutil.rmtree(cache, ignore_errors=True)
                        if row == "decode":
                            cmd = [sys.executable, "-c", _DECODE, str(path)]
                        elif row == "load":
                            cmd = [sys.executable, "-c", _LOAD, str(path.parent)]
                        else:
                            cmd = [sys.executable, "-m", "tracelens", "analyze", str(path.parent)]
                            cmd += ["-o", str(scratch / "out"), "--cache-dir", str(cache)]
                            if row == "analyze_no_report":
                                cmd.append("--no-report")
                        m = _measure(cmd, env, scratch)
                        results.setdefault((mb, shape, row, code), []).append(m)
                        print(
                            f"round {rnd + 1} {shape:5s} {mb:5d} MB {row:18s} {code:5s} {m['wall_s']:8.2f} s "
                            f"{m['peak_tree_rss'] / 2**20:7.0f} MiB",
                            flush=True,
                        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average now {os.getloadavg()[0]:.1f}"
    )
    print(
        "| trace | steps | row | code | seconds (median) | CPU s | x decode | MB/s | peak RSS MiB (median) |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    out = []
    for (mb, shape), (_path, info) in traces.items():
        ref = (
            statistics.median(m["wall_s"] for m in results.get((mb, shape, "decode", "this"), []))
            if ("decode" in rows)
            else float("nan")
        )
        for row in rows:
            for code in codes if row != "decode" else ["this"]:
                ms = results[(mb, shape, row, code)]
                wall = statistics.median(m["wall_s"] for m in ms)
                cpu = statistics.median(m["cpu_s"] for m in ms)
                rss = statistics.median(m["peak_tree_rss"] for m in ms) / 2**20
                print(
                    f"| {shape} {mb} MB | {info['steps']:,} | {row} | {code} | {wall:.2f} | {cpu:.2f} | "
                    f"{wall / ref:.1f} | "
                    f"{info['bytes'] / 1e6 / wall:.0f} | {rss:.0f} |"
                )
                out.append({"mb": mb, "shape": shape, "row": row, "code": code, "runs": ms, **info})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.clean:
        for path, _info in traces.values():
            shutil.rmtree(path.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
