"""The real runs under ../shared/runs (torch.distributed.pipelining schedules, DeviceMesh, DDP, FSDP2, DTensor
tensor parallelism; gloo), each with a manifest.json of the truth: the layout, the schedule and the K/V-head
replication tracelens infers from the traces equal the manifest's, and the layout the user would state is
accepted. Skips only when the runs folder is absent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tracelens.run_analysis import Options, analyze_run

RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "runs"
_RUN_DIRS = sorted(p for p in RUNS.iterdir() if (p / "manifest.json").exists()) if RUNS.is_dir() else []

pytestmark = pytest.mark.skipif(not _RUN_DIRS, reason=f"{RUNS} is absent (real runs with a manifest each)")


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _norm(name: object) -> str:
    n = re.sub(r"[^a-z0-9]", "", str(name or "").lower())
    return n[len("schedule") :] if n.startswith("schedule") else n


def _model_config(man: dict, tmp: Path) -> str | None:
    """The model's config.json, as a user passes it (the tensor-parallel runs' manifests give the attention)."""
    at = man.get("attention")
    if not at:
        return None
    layers = sum(sum(st["layers"].values()) for st in man["stages"].values())
    cfg = {
        "model_type": "llama",
        "hidden_size": at["hidden"],
        "num_attention_heads": at["n_heads"],
        "num_key_value_heads": at["n_kv_heads"],
        "head_dim": at["head_dim"],
        "num_hidden_layers": layers,
        "intermediate_size": 2 * at["hidden"],
        "vocab_size": 256,
    }
    p = tmp / f"{man['name']}-config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.fixture(scope="module")
def inferred(tmp_path_factory):
    """Per run: (manifest, the analysis without a layout, the analysis with the manifest's layout), sharing one
    cache so that the second analysis reads the run's stages instead of the traces."""
    tmp = tmp_path_factory.mktemp("shared_runs")
    out = {}
    for d in _RUN_DIRS:
        man = _manifest(d)
        cache = str(tmp / "cache")
        model = _model_config(man, tmp)
        a = analyze_run(d, Options(cache_dir=cache, model=model))
        lay = man["layout"]
        given = analyze_run(
            d,
            Options(
                cache_dir=cache,
                model=model,
                layout=",".join(f"{k}={lay[k]}" for k in ("tp", "pp", "dp", "cp")),
            ),
        )
        out[d.name] = (man, a, given)
    return out


@pytest.fixture(scope="module")
def summaries(inferred):
    """Per run: its summary.json (the findings the evaluation of ../shared/runs reads)."""
    return {name: a.summary() for name, (_, a, _) in inferred.items()}


def _findings(s: dict, code: str, severities=("warning", "error")) -> list[dict]:
    return [f for f in s["findings"] if f["code"] == code and f["severity"] in severities]


@pytest.mark.parametrize("run", [d.name for d in _RUN_DIRS])
def test_verdicts_as_the_manifest_says(inferred, summaries, run):
    """The checks of ../shared/runs/evaluate.py: stragglers and their causes, the heavy stage, unequal stage
    composition, quiet clean runs, the hang's culprit and no hang in its twin."""
    man, _, _ = inferred[run]
    s, exp = summaries[run], man["expect"]
    want = {int(x["rank"]): x["cause"] for x in exp.get("stragglers", [])}
    got = {int(x["rank"]): x["cause"] for x in s["stragglers"]}
    tolerated = set()
    if exp.get("heavy_stage") is not None:  # compute stragglers on the heavy stage's ranks are its effect
        tolerated = {int(r) for r in man["stages"][str(exp["heavy_stage"])]["ranks"]}
    assert {r: c for r, c in got.items() if not (r in tolerated and c == "compute" and r not in want)} == want
    if exp.get("heavy_stage") is not None:
        named = [f.get("stages") for f in _findings(s, "STAGE_IMBALANCE", ("info", "warning", "error"))]
        assert any(exp["heavy_stage"] in (st or []) for st in named), named
    if (man["layout"].get("pp") or 1) > 1:
        unequal = _findings(s, "UNEQUAL_STAGE_COMPOSITION", ("info", "warning", "error"))
        assert bool(unequal) == bool(exp.get("unequal_composition"))
    if exp.get("clean"):
        codes = (
            ("STRAGGLER",)
            if exp.get("unequal_composition")
            else ("STRAGGLER", "STAGE_IMBALANCE", "PIPELINE_BUBBLE_EXCESS")
        )
        assert not [f for c in codes for f in _findings(s, c)]
    hangs = _findings(s, "COLLECTIVE_HANG", ("info", "warning", "error")) + _findings(
        s, "P2P_HANG", ("info", "warning", "error")
    )
    if exp.get("hang_culprit") is not None:
        hc = exp["hang_culprit"]
        assert any(
            f.get("root_rank") == hc
            or (hc in (f.get("ranks") or []) and len(set(f["ranks"])) < man["world_size"])
            for f in hangs
        ), hangs
    elif man.get("family") == "hang":
        assert not hangs


@pytest.mark.parametrize("run", [d.name for d in _RUN_DIRS])
def test_layout_inferred_from_evidence(inferred, run):
    man, a, _ = inferred[run]
    g = a.grid
    want = {k: man["layout"][k] for k in ("tp", "pp", "dp", "cp")}
    assert {k: getattr(g, k) for k in want} == want, g.evidence
    assert g.source == "inferred"
    # the stages: every rank where the manifest puts it
    if want["pp"] > 1:
        for r, c in man["rank_coords"].items():
            assert g.stage_of(int(r)) == c["pp"], (r, g.coords)
    # what each axis rested on is said, and no axis of more than one rank rests on a guess
    for axis, deg in want.items():
        if deg > 1:
            assert g.evidence.get(axis, {}).get("basis") in ("traffic", "p2p", "roles", "names", "remainder")


@pytest.mark.parametrize("run", [d.name for d in _RUN_DIRS if _manifest(d).get("schedule")])
def test_schedule_recognised(inferred, run):
    man, a, _ = inferred[run]
    sch, pipe = man["schedule"], a.pipeline
    assert (_norm(pipe.schedule), pipe.virtual_stages, pipe.microbatches) == (
        _norm(sch["name"]),
        sch["v"],
        sch["m"],
    )
    assert pipe.expected_bubble_fraction is not None and 0 <= pipe.expected_bubble_fraction < 1


@pytest.mark.parametrize("run", [d.name for d in _RUN_DIRS if _manifest(d).get("attention")])
def test_kv_head_replication_from_the_trace(inferred, run):
    man, a, _ = inferred[run]
    _, found = a.audit([])
    kv = [f for f in found if f["code"] == "KV_HEAD_REPLICATION"]
    at = man["attention"]
    widths = {w["k_proj_local_out"] for r in at["kv_proj_out_width_per_rank"].values() for w in r.values()}
    exact = at["n_kv_heads"] * at["head_dim"] / man["layout"]["tp"]
    if man["expect"].get("kv_head_replication"):
        assert len(kv) == 1
        ev = kv[0]["trace_evidence"]
        assert ev["kv_width"] in widths and ev["exact_width"] == exact
        assert ev["factor"] == pytest.approx(max(widths) / exact)
    else:
        assert not kv


@pytest.mark.parametrize("run", [d.name for d in _RUN_DIRS])
def test_the_users_correct_layout_is_accepted(inferred, run):
    man, _, given = inferred[run]
    g = given.grid
    assert {k: getattr(g, k) for k in ("tp", "pp", "dp", "cp")} == {
        k: man["layout"][k] for k in ("tp", "pp", "dp", "cp")
    }
    bad = [f for f in given._grid_and_findings[1] if f["code"] == "LAYOUT_INCONSISTENT"]
    assert not bad, bad
    for r, c in man["rank_coords"].items():
        assert g.stage_of(int(r)) == c.get("pp", 0)
