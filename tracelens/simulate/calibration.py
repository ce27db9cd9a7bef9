"""Fit the simulator's kernel-cost ramps to kernel timings measured on a GPU.

Input: the `calibration.json` that scripts/record_cuda_block.py writes (one row per timed GEMM, attention
and memory-bound kernel, each with its work and measured efficiency). Output: the parameters of a
`costs.KernelCosts` preset, each efficiency modelled as `eff x W / (W + half)` (W = FLOPs or bytes),
fitted by least squares on the log of the efficiency (relative error, so small and large kernels weigh
alike). The `h200-measured` preset in costs.py holds the fit of docs/calibration-h200.json:

    python -m tracelens.simulate.calibration docs/calibration-h200.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt


def fit_ramp(work: npt.ArrayLike, eff: npt.ArrayLike) -> tuple[float, float]:
    """(eff_max, half) minimising the squared log error of eff_max * W / (W + half)."""
    from scipy.optimize import least_squares

    work = np.asarray(work, float)
    eff = np.asarray(eff, float)
    scale = float(np.median(work))

    def resid(p: np.ndarray) -> np.ndarray:
        return np.log(p[0] * work / (work + p[1] * scale)) - np.log(eff)

    r = least_squares(resid, [float(eff.max()), 0.1], bounds=([1e-3, 0.0], [1.0, 1e3]))
    return float(r.x[0]), float(r.x[1] * scale)


def fit(cal: dict) -> dict:
    """KernelCosts parameters fitted to one calibration.json."""
    g = cal["gemm"]
    a = cal["attention"]
    m = cal["memory_bound"]
    out: dict = {}
    out["gemm_eff"], out["gemm_half_flops"] = fit_ramp([r["flops"] for r in g], [r["eff"] for r in g])
    out["attn_fwd_eff"], out["attn_fwd_half_flops"] = fit_ramp(
        [r["fwd_flops"] for r in a], [r["fwd_eff"] for r in a]
    )
    out["attn_bwd_eff"], out["attn_bwd_half_flops"] = fit_ramp(
        [2.5 * r["fwd_flops"] for r in a], [r["bwd_eff"] for r in a]
    )
    out["hbm_eff"], out["hbm_half_bytes"] = fit_ramp([r["bytes"] for r in m], [r["eff"] for r in m])
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tracelens.simulate.calibration CALIBRATION.json", file=sys.stderr)
        return 2
    cal = json.loads(Path(args[0]).read_text())
    for k, v in fit(cal).items():
        print(f"{k} = {v:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
