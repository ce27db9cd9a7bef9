"""The checks `../shared/runs/evaluate.py` makes of a summary against a run's manifest.json (layout, stragglers
and their causes, the heavy stage, unequal stage composition, quiet clean runs, the hang's culprit, no hang
in a twin, the schedule), as assertions: shared by the tests on ../shared/runs and on the runs this project
recorded with PyTorch's own parallelism libraries (tests/data/torchlibs, scripts/record_torch_parallel.py)."""

from __future__ import annotations

import re


def _findings(s: dict, code: str, severities=("warning", "error")) -> list[dict]:
    return [f for f in s["findings"] if f["code"] == code and f["severity"] in severities]


def norm_schedule(name: object) -> str:
    n = re.sub(r"[^a-z0-9]", "", str(name or "").lower())
    return n[len("schedule") :] if n.startswith("schedule") else n


def check_layout(man: dict, s: dict) -> None:
    lay = s["run"]["layout"]
    assert {k: lay[k] for k in ("tp", "pp", "dp", "cp")} == {
        k: man["layout"][k] for k in ("tp", "pp", "dp", "cp")
    }


def check_schedule(man: dict, s: dict) -> None:
    sch, p = man.get("schedule"), s.get("pipeline") or {}
    if sch:
        got = (norm_schedule(p.get("schedule")), p.get("virtual_stages"), p.get("microbatches"))
        assert got == (norm_schedule(sch["name"]), sch["v"], sch["m"])


def check_verdicts(man: dict, s: dict) -> None:
    exp = man["expect"]
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
        codes = ("STRAGGLER",)
        if not exp.get("unequal_composition"):
            codes += ("STAGE_IMBALANCE", "PIPELINE_BUBBLE_EXCESS")
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
