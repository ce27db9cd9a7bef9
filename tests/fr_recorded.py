"""Flight Recorder hang runs recorded with scripts/record_fr_hang.py (torch 2.13, gloo, pipelining / DDP /
FSDP2), kept small: per run, tests/data/fr_hangs/<name>/ holds each rank's JSON dump (gzipped), the groups
each rank's Kineto trace declares (`groups.json`: distributedInfo.pg_config per rank) and `truth.json`
(layout, schedule, fault, culprit). The traces themselves are not kept (the hangs happen after the profiled
steps; the diagnosis reads only the dumps and the traces' group lists).

    python -m tests.fr_recorded --store        # record every run of RUNS again and store it (~5 min)

`pytest -m recording` records runs live and checks the full `analyze` on them (tests/unit/test_fr_recorded.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "record_fr_hang.py"
STORED = REPO / "tests" / "data" / "fr_hangs"

#: name -> record_fr_hang.py flags. Twins without a hang end in `_clean`.
RUNS: dict[str, list[str]] = {
    "pp4dp2_1f1b_ddp_skipsend2": ["--fault", "skip-send", "--fault-rank", "2"],
    "pp4dp2_gpipe_ddp_skipsend5": ["--schedule", "gpipe", "--fault", "skip-send", "--fault-rank", "5"],
    "pp4dp2_1f1b_ddp_stall6": ["--fault", "stall", "--fault-rank", "6"],
    "pp4dp2_1f1b_ddp_skipcoll5": ["--fault", "skip-collective", "--fault-rank", "5"],
    "pp4dp2_1f1b_ddp_clean": [],
    "pp4_gpipe_skipcoll1": ["--world", "4", "--pp", "4", "--schedule", "gpipe", "--fault", "skip-collective",
                            "--fault-rank", "1"],
    "pp4_gpipe_clean": ["--world", "4", "--pp", "4", "--schedule", "gpipe"],
    "pp2dp2_1f1b_fsdp_skipcoll3": ["--world", "4", "--pp", "2", "--dp-mode", "fsdp", "--fault",
                                   "skip-collective", "--fault-rank", "3"],
    "pp2dp2_1f1b_fsdp_stall1": ["--world", "4", "--pp", "2", "--dp-mode", "fsdp", "--fault", "stall",
                                "--fault-rank", "1"],
    "pp2dp2_1f1b_fsdp_clean": ["--world", "4", "--pp", "2", "--dp-mode", "fsdp"],
    "dp4_ddp_skipcoll0": ["--world", "4", "--pp", "1", "--fault", "skip-collective", "--fault-rank", "0"],
    "dp4_ddp_clean": ["--world", "4", "--pp", "1"],
}  # fmt: skip


def record(name: str, out: Path) -> Path:
    """Record run `name` (RUNS) live into `out` (traces, dumps, truth.json)."""
    subprocess.run(
        [sys.executable, str(SCRIPT), "-o", str(out), *RUNS[name]], check=True, capture_output=True
    )
    return out


def derive(recorded: Path, dest: Path) -> Path:
    """The small fixture of a recorded run: gzipped JSON dumps, the traces' group lists, the truth."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted((recorded / "flight_recorder" / "json").glob("fr_trace_rank_*.json")):
        (dest / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes(), mtime=0))
    groups = {}
    for t in sorted((recorded / "traces").glob("*.json.gz")):
        di = json.loads(gzip.decompress(t.read_bytes())).get("distributedInfo") or {}
        groups[str(di["rank"])] = di.get("pg_config")
    (dest / "groups.json").write_text(
        json.dumps(dict(sorted(groups.items(), key=lambda kv: int(kv[0])))) + "\n"
    )
    truth = json.loads((recorded / "truth.json").read_text())
    keep = (
        "recorded_with",
        "world_size",
        "layout",
        "schedule",
        "dp_mode",
        "profiled_steps",
        "fault",
        "hang_culprit",
    )
    kept = {k: truth[k] for k in keep}
    argv = list(kept["recorded_with"]["argv"])
    if "-o" in argv:  # the output folder was a temporary one
        del argv[argv.index("-o") : argv.index("-o") + 2]
    kept["recorded_with"]["argv"] = argv
    (dest / "truth.json").write_text(json.dumps(kept, indent=1) + "\n")
    return dest


def stored_runs() -> list[str]:
    return sorted(p.name for p in STORED.iterdir() if (p / "truth.json").is_file()) if STORED.is_dir() else []


def load(run: Path):
    """(COLLECTIVES of the dumps, {(rank, pg_name): ranks}, {pg_name: desc}, truth) of a stored run."""
    import pyarrow as pa

    from tracelens.analyze.comm.hang import trace_groups
    from tracelens.ingest import flight_recorder

    coll = flight_recorder.read_many(sorted(run.glob("fr_trace_rank_*.json.gz")))
    groups = json.loads((run / "groups.json").read_text())
    meta = pa.table(
        {"rank": [int(r) for r in groups], "pg_config_json": [json.dumps(g) for g in groups.values()]}
    )
    members, descs = trace_groups(meta)
    return coll, members, descs, json.loads((run / "truth.json").read_text())


def store() -> None:
    for name in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            rec = record(name, Path(tmp) / name)
            shutil.rmtree(STORED / name, ignore_errors=True)
            derive(rec, STORED / name)
            print("stored", name)


if __name__ == "__main__":
    if sys.argv[1:] == ["--store"]:
        store()
    else:
        print(__doc__)
