"""Bad-input row: salvage speed on a damaged real trace, and peak memory on each bomb class.

Each measurement runs in a fresh Python process (time of `kineto.read` / the reader, and `ru_maxrss` above
the process's RSS after imports). Inputs are built under a temporary folder and removed after.

    .venv/bin/python benchmarks/bad_input.py                 # HTA negative_queue_length (25.8 MB of JSON)
    .venv/bin/python benchmarks/bad_input.py TRACE.json.gz --repeat 3

Rows:
- clean_read: salvage read of the whole trace (the reference time).
- one_bad_byte_mid: the same with one byte in the middle turned into an invalid one (a bare `N` in a
  number): every other event must be read, in about the time of the clean read.
- bad_event_every_50_kernels: a damaged number in one event of every 50 (linearity).
- cut_at_60pct: the trace cut at 60% of its bytes (a profiler killed mid-write).
- bombs (peak RSS): a gzip of spaces between two events (default 960 MiB of padding in ~1000:1 members: under
  the ratio guard's 1 GiB floor, so it is read through), the same padding before `traceEvents`, a sparse file
  of zeros (default 4 GiB), a Flight Recorder JSON gzip bomb (inflates past its 256 MiB cap), a pickle memo
  bomb (one record referenced 900,000 times), a pickle of 12M empty records (24 MB), the sparse zero file
  read as a Flight Recorder dump and as a plugin file, an NCCL log gzip with one 960 MiB line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (
    REPO.parent / "shared" / "traces" / "hta" / "negative_queue_length_values_check" / "rank0.json.gz"
)

_PRELUDE = r"""
import json, resource, sys, time
from tracelens.ingest import kineto, flight_recorder, nccl_log
import pyarrow as pa; pa.array([1]).sum()
def rss_kb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * (resource.getpagesize() // 1024)
base = rss_kb()
t0 = time.perf_counter()
out = {}
try:
    WHAT
except Exception as e:
    out["error"] = f"{type(e).__name__}: {str(e)[:160]}"
out["seconds"] = time.perf_counter() - t0
out["peak_mb_above_base"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
print(json.dumps(out))
"""


def _run(what: str) -> dict:
    code = _PRELUDE.replace("WHAT", what)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _read(path: Path) -> str:
    return (
        f"tr = kineto.read({str(path)!r}, salvage=True); out['rows'] = tr.events.num_rows; "
        "out['damaged'] = tr.metadata['damaged_events']; out['salvaged'] = tr.metadata['salvaged']"
    )


def _spaces_member(n: int) -> bytes:
    d = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return d.compress(b" " * n) + d.flush()


def build(tmp: Path, trace: Path, pad: int, zeros: int) -> dict[str, tuple[Path, str]]:
    raw = gzip.decompress(trace.read_bytes()) if trace.read_bytes()[:2] == b"\x1f\x8b" else trace.read_bytes()
    cases: dict[str, tuple[Path, str]] = {}
    p = tmp / "clean.json"
    p.write_bytes(raw)
    cases["clean_read"] = (p, _read(p))
    mid = len(raw) // 2
    m = re.compile(rb'"dur": ?\d').search(raw, mid)
    assert m is not None
    bad = bytearray(raw)
    bad[m.end() - 1] = ord("N")
    p = tmp / "one_bad_byte.json"
    p.write_bytes(bad)
    cases["one_bad_byte_mid"] = (p, _read(p))
    bad = bytearray(raw)
    for i, m in enumerate(re.finditer(rb'"cat": ?"kernel"', raw)):
        if i % 50 == 0:
            q = re.compile(rb'"dur": ?\d').search(bad, m.end())
            if q is not None:
                bad[q.end() - 1] = ord("N")
    p = tmp / "many_bad.json"
    p.write_bytes(bad)
    cases["bad_event_every_50_kernels"] = (p, _read(p))
    p = tmp / "cut.json"
    p.write_bytes(raw[: int(len(raw) * 0.6)])
    cases["cut_at_60pct"] = (p, _read(p))
    # bombs
    doc = b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 1, "dur": 1}, '
    tail = b'{"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": 3, "dur": 1}]}'
    member = _spaces_member(64 << 20)
    p = tmp / "pad_between.json.gz"
    p.write_bytes(gzip.compress(doc) + member * (pad // (64 << 20)) + gzip.compress(tail))
    cases["bomb_gzip_spaces_between_events"] = (p, _read(p))
    p = tmp / "pad_head.json.gz"
    p.write_bytes(gzip.compress(b"{") + member * (pad // (64 << 20)) + gzip.compress(doc[1:] + tail))
    cases["bomb_gzip_spaces_before_traceEvents"] = (p, _read(p))
    p = tmp / "zeros.json"
    with open(p, "wb") as fh:
        fh.truncate(zeros)
    cases["bomb_sparse_zero_file"] = (p, _read(p))
    d = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    p = tmp / "fr_trace_rank_0.json.gz"
    with open(p, "wb") as fh:
        fh.write(d.compress(b'{"version": "2.4", "entries": ['))
        for _ in range(24):
            fh.write(d.compress(b" " * (64 << 20)))
        fh.write(d.flush())
    cases["bomb_flight_recorder_gzip"] = (p, f"flight_recorder.read({str(p)!r})")
    entry = {"record_id": 0, "pg_id": 0, "collective_seq_id": 1, "profiling_name": "nccl:all_reduce"}
    p = tmp / "fr_trace_rank_1"
    p.write_bytes(pickle.dumps({"version": "2.4", "pg_config": {}, "entries": [entry] * 900_000}, protocol=4))
    cases["bomb_pickle_memo"] = (p, f"flight_recorder.read({str(p)!r})")
    p = tmp / "fr_trace_rank_2"
    p.write_bytes(pickle.dumps({"version": "2.4", "entries": [{} for _ in range(12_000_000)]}, protocol=4))
    cases["bomb_pickle_empty_records"] = (p, f"flight_recorder.read({str(p)!r})")
    p = tmp / "fr_trace_rank_3.json"
    with open(p, "wb") as fh:
        fh.truncate(zeros)
    cases["bomb_sparse_zero_flight_recorder"] = (p, f"flight_recorder.read({str(p)!r})")
    cases["bomb_sparse_zero_plugin_file"] = (
        p,
        f"from tracelens.ingest import nccl_plugin; nccl_plugin.load_events({str(p)!r})",
    )
    line = b"h:1:2 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 4 datatype 7 op 0 root 0 comm 0xa [nranks=2] stream 0x5\n"
    d = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    p = tmp / "nccl.log.gz"
    with open(p, "wb") as fh:
        fh.write(d.compress(line))
        for _ in range(15):
            fh.write(d.compress(b"x" * (64 << 20)))
        fh.write(d.compress(b"\n" + line) + d.flush())
    cases["bomb_nccl_log_one_long_line"] = (
        p,
        f"calls, inits, v = nccl_log.parse({str(p)!r}); out['calls'] = len(calls)",
    )
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pad-mib", type=int, default=960, help="whitespace padding of the gzip bombs")
    ap.add_argument("--zeros-mib", type=int, default=4096, help="size of the sparse zero file")
    args = ap.parse_args()
    if not args.trace.exists():
        sys.exit(f"{args.trace}: not found")
    with tempfile.TemporaryDirectory(prefix="tracelens-bad-input-") as tmp:
        cases = build(Path(tmp), args.trace, args.pad_mib << 20, args.zeros_mib << 20)
        print(f"trace: {args.trace} ({cases['clean_read'][0].stat().st_size / 1e6:.1f} MB of JSON)")
        print("| case | seconds (median) | peak RSS above baseline MB | outcome |")
        print("|---|---|---|---|")
        for name, (_path, what) in cases.items():
            reps = args.repeat if not name.startswith("bomb") else 1
            res = [_run(what) for _ in range(reps)]
            secs = statistics.median(r.get("seconds", float("nan")) for r in res)
            peak = max(r.get("peak_mb_above_base", float("nan")) for r in res)
            r = res[-1]
            outcome = r.get("error") or ", ".join(
                f"{k} {v}" for k, v in r.items() if k not in ("seconds", "peak_mb_above_base")
            )
            print(f"| {name} | {secs:.2f} | {peak:.0f} | {outcome} |", flush=True)


if __name__ == "__main__":
    main()
