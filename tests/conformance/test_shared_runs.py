"""The real runs under ../shared/runs (torch.distributed.pipelining schedules, DeviceMesh, DDP, FSDP2, DTensor
tensor parallelism; gloo), each with a manifest.json of the truth: the layout, the schedule and the K/V-head
replication tracelens infers from the traces equal the manifest's, and the layout the user would state is
accepted. Skips only when the runs folder is absent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.manifest_checks import check_verdicts
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


@pytest.mark.parametrize("run", [d.name for d in _RUN_DIRS])
def test_verdicts_as_the_manifest_says(inferred, summaries, run):
    """The checks of ../shared/runs/evaluate.py: stragglers and their causes, the heavy stage, unequal stage
    composition, quiet clean runs, the hang's culprit and no hang in its twin."""
    man, _, _ = inferred[run]
    check_verdicts(man, summaries[run])
