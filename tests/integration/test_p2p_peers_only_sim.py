"""A pipeline whose P2P kernels carry only `Src Rank` / `Dst Rank` (no collective name, no process-group
fields, no sequence numbers): sends and receives are still matched by (source, destination, order), so the
critical path crosses ranks and the what-if of the heavy stage predicts what its twin without it measures
(issue 40, item 6)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tracelens.run_analysis import Options, analyze_run
from tracelens.simulate import SimConfig, simulate

#: What the stripped P2P records keep: their peers, nothing that names the group, the call or its order.
DROPPED = ("Collective name", "Process Group Name", "Process Group Description", "Process Group Ranks", "Seq",
           "Group size", "Global rank start", "Global rank stride", "Rank")  # fmt: skip


def llama(layers: int) -> dict:
    return {
        "model_type": "llama", "num_hidden_layers": layers, "hidden_size": 1024, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 4096, "vocab_size": 1000,
    }  # fmt: skip


BASE = {"seq_len": 2048, "microbatches": 4, "steps": 3, "seed": 0, "gzip": False, "pp": 4}


def _strip(src: Path, dst: Path) -> None:
    dst.mkdir()
    for f in src.glob("*.json"):
        doc = json.loads(f.read_text())
        if "traceEvents" not in doc:
            continue
        for e in doc["traceEvents"]:
            a = e.get("args") or {}
            if "Src Rank" in a or a.get("Collective name") in ("send", "recv"):
                for k in DROPPED:
                    a.pop(k, None)
        (dst / f.name).write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("p2p-peers-only")
    out = {}
    for name, cfg in (
        ("clean", {"model": llama(16)}),
        ("heavy", {"model": llama(18), "split": [4, 6, 4, 4]}),
    ):
        simulate(SimConfig(**BASE, **cfg), root / name)
        _strip(root / name, root / f"{name}-stripped")
        a = analyze_run(root / f"{name}-stripped", Options(no_cache=True))
        out[name] = (a.summary(), a)
    return out


def _step(s: dict) -> float:
    return statistics.mean(r["step_time_ms"] for r in s["ranks"])


def test_stripped_p2p_records_are_matched_as_sends_and_receives(twins):
    _, a = twins["heavy"]
    coll = a.cross.collectives.to_pandas()
    p2p = coll[coll["is_p2p"].astype(bool)]
    assert set(p2p["op"]) == {"send", "recv"}
    assert p2p["peer"].notna().all() and (p2p["instance"] >= 0).all()
    # every instance pairs one send with one receive, on two ranks
    per = p2p.groupby("instance").agg(ops=("op", lambda o: tuple(sorted(o))), ranks=("rank", "nunique"))
    assert (per["ops"] == ("recv", "send")).all() and (per["ranks"] == 2).all()
    assert a.grid.pp == 4 and a.grid.pipelines() == [[0, 1, 2, 3]]


def test_critical_path_crosses_ranks_and_what_if_predicts_the_twin(twins):
    heavy, _ = twins["heavy"]
    clean, _ = twins["clean"]
    by_rank = heavy["critical_path"]["by_rank_ms"]
    assert sum(1 for v in by_rank.values() if v > 0.05 * heavy["critical_path"]["step_time_ms"]) >= 3
    fix = next(w for w in heavy["what_if"] if "stage 1" in (w.get("change") or ""))
    measured = _step(heavy) - _step(clean)
    assert measured > 0
    assert fix["saving_ms"] == pytest.approx(measured, rel=0.25)
