"""Regression rules for CI (`tracelens check`): compare a baseline summary with a current one.

Each rule compares one headline quantity of two `tracelens.summary/1` dicts and says pass, fail or
skip (with the reason when data are missing). Rules over noisy per-step quantities (step time,
exposed-communication share, bubble share) fail only when the change exceeds a threshold AND a
one-sided Mann-Whitney U test on the per-step samples says it is significant, so CI stays green on
noise. See docs/ci.md for the statistics and the rules file.

Pure functions: summaries in, `CheckReport` out. The output formats (text, Markdown, JUnit, GitHub, JSON)
are in `tracelens.report.check_renderers`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from tracelens.errors import BadConfigError, BadInputError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib


#: per-call memo of per_step column arrays (id(rows) -> (rows, arrays)), active only inside `check`
_ARRAYS_MEMO: ContextVar[dict[int, tuple[list[Any], dict[str, np.ndarray]]] | None] = ContextVar(
    "_ARRAYS_MEMO", default=None
)
STATUSES = ("pass", "fail", "skip")

# ----------------------------------------------------------------------------------------------------------
# Rules configuration (defaults are documented in docs/ci.md and examples/rules.toml)


@dataclass(frozen=True)
class StepTimeRule:
    """Median step time may not grow by more than `max_increase_pct` percent with significance `alpha`."""

    enabled: bool = True
    max_increase_pct: float = 5.0
    alpha: float = 0.05
    #: how one step's time is taken across ranks: "max" (the pace of the job) or "median"
    aggregate: str = "max"


@dataclass(frozen=True)
class ShareRule:
    """A per-step share of step time (in percent) may not grow by more than `max_increase_points`."""

    enabled: bool = True
    max_increase_points: float = 2.0
    alpha: float = 0.05


@dataclass(frozen=True)
class MfuRule:
    """MFU may not drop by more than `max_drop_points` percentage points."""

    enabled: bool = True
    max_drop_points: float = 2.0


@dataclass(frozen=True)
class StragglerRule:
    """No rank may be a straggler in the current run that was not one in the baseline."""

    enabled: bool = True


@dataclass(frozen=True)
class FindingsRule:
    """No finding code may appear at one of `severities` that did not appear at them in the baseline."""

    enabled: bool = True
    severities: tuple[str, ...] = ("error",)
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rules:
    """All rules of `tracelens check`; `Rules()` holds the documented defaults."""

    step_time: StepTimeRule = field(default_factory=StepTimeRule)
    mfu: MfuRule = field(default_factory=MfuRule)
    exposed_comm: ShareRule = field(default_factory=ShareRule)
    bubble: ShareRule = field(default_factory=ShareRule)
    stragglers: StragglerRule = field(default_factory=StragglerRule)
    findings: FindingsRule = field(default_factory=FindingsRule)


def rules_from_dict(data: dict[str, Any], source: str = "rules") -> Rules:
    """Build `Rules` from a parsed rules.toml; unknown sections or keys and wrong types are errors.

    Typos must not silently disable a guard, hence the strictness.
    """
    if not isinstance(data, dict):
        raise BadConfigError(f"{source}: expected a table of rule sections")
    rules = Rules()
    known = {f.name: f for f in fields(Rules)}
    for section, values in data.items():
        if section not in known:
            raise BadConfigError(
                f"{source}: unknown rule section [{section}] (known: {', '.join(sorted(known))})"
            )
        if not isinstance(values, dict):
            raise BadConfigError(f"{source}: [{section}] must be a table")
        current = getattr(rules, section)
        updates: dict[str, Any] = {}
        for key, value in values.items():
            updates[key] = _coerce_rule_value(current, section, key, value, source)
        try:
            new = replace(current, **updates)
        except TypeError as err:  # pragma: no cover - keys are checked above
            raise BadConfigError(f"{source}: [{section}]: {err}") from err
        _validate_rule(new, section, source)
        rules = replace(rules, **{section: new})
    return rules


def _coerce_rule_value(rule: Any, section: str, key: str, value: Any, source: str) -> Any:
    """Check one key of a rule section against the dataclass default's type."""
    names = {f.name for f in fields(rule)}
    if key not in names:
        raise BadConfigError(
            f"{source}: unknown key {key!r} in [{section}] (known: {', '.join(sorted(names))})"
        )
    default = getattr(rule, key)
    where = f"{source}: [{section}] {key}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise BadConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BadConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise BadConfigError(f"{where} must be a string, got {value!r}")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BadConfigError(f"{where} must be a list of strings, got {value!r}")
        return tuple(value)
    raise AssertionError(f"unhandled rule type for {section}.{key}")  # pragma: no cover


def _validate_rule(rule: Any, section: str, source: str) -> None:
    """Range checks that types alone do not catch."""
    where = f"{source}: [{section}]"
    alpha = getattr(rule, "alpha", None)
    if alpha is not None and not 0.0 < alpha < 1.0:
        raise BadConfigError(f"{where} alpha must be between 0 and 1, got {alpha}")
    for key in ("max_increase_pct", "max_increase_points", "max_drop_points"):
        value = getattr(rule, key, None)
        if value is not None and value < 0:
            raise BadConfigError(f"{where} {key} must be >= 0, got {value}")
    if isinstance(rule, StepTimeRule) and rule.aggregate not in ("max", "median"):
        raise BadConfigError(f'{where} aggregate must be "max" or "median", got {rule.aggregate!r}')
    if isinstance(rule, FindingsRule):
        bad = [s for s in rule.severities if s not in ("info", "warning", "error")]
        if bad:
            raise BadConfigError(f"{where} severities must be info, warning or error, got {bad}")


def load_rules(path: str | Path | None) -> Rules:
    """Read a rules.toml (None -> defaults); raises BadConfigError on a missing or invalid file."""
    if path is None:
        return Rules()
    path = Path(path)
    if not path.is_file():
        raise BadConfigError(f"rules file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise BadConfigError(f"{path}: not valid TOML: {err}") from err
    return rules_from_dict(data, source=str(path))


# ----------------------------------------------------------------------------------------------------------
# Loading summaries


def validate_summary(data: Any, label: str) -> None:
    """`tracelens.summary.validate_summary` (the one validator), then the per-step samples the rules read."""
    from tracelens.summary_check import validate_summary as validate_document

    validate_document(data, label)
    per_step = data.get("per_step")
    if per_step:
        try:
            _per_step_arrays(per_step)
        except ValueError as err:
            raise BadInputError(f"{label}: {err}") from err


# ----------------------------------------------------------------------------------------------------------
# Results


@dataclass
class RuleResult:
    """Outcome of one rule. Numbers are in `unit`; `delta` is current minus baseline (or relative, in %)."""

    rule: str
    title: str
    status: str
    message: str
    baseline: Any = None
    current: Any = None
    delta: Any = None
    unit: str = ""
    delta_unit: str = ""
    threshold: str = ""
    p_value: float | None = None
    n_baseline: int | None = None
    n_current: int | None = None
    seconds: float = 0.0
    #: True when too few steps for the significance test: the rule decided on its threshold alone
    threshold_only: bool = False
    #: False when the rule cannot apply to these runs (no pipeline): such a skip never fails, even --strict
    applies: bool = True


@dataclass
class CheckReport:
    """All rule results for one baseline/current pair."""

    baseline_label: str
    current_label: str
    results: list[RuleResult]
    rules: Rules
    #: reasons the two runs may not be comparable (different world size, layout, GPU, sequence length)
    notes: list[str] = field(default_factory=list)
    #: `--strict`: a skipped rule fails the check too
    strict: bool = False
    #: `--allow-setup-change`: a verdict even when the setups differ (the notes stay)
    allow_setup_change: bool = False

    @property
    def comparable(self) -> bool:
        """Whether the runs are comparable: same world size, layout, GPU and sequence length where both say,
        or `allow_setup_change`. A check of runs that are not gives no regression verdict: the rules cannot
        tell a changed setup from a regression (exit 2)."""
        return not self.notes or self.allow_setup_change

    @property
    def failed(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def skipped(self) -> list[RuleResult]:
        return [r for r in self.results if r.status == "skip"]

    @property
    def regressed(self) -> bool:
        return bool(self.failed) and self.comparable

    @property
    def exit_code(self) -> int:
        """0 when every rule passed or was skipped, 1 on a regression, 2 when the runs are not comparable
        (no verdict; other bad input is raised earlier).

        With `strict`, a skipped rule also gives 1.
        """
        if not self.comparable:
            return 2
        return 1 if self.regressed or (self.strict and self.strict_skips) else 0

    @property
    def strict_skips(self) -> list[RuleResult]:
        """Skipped rules that could have applied (those fail under --strict)."""
        return [r for r in self.results if r.status == "skip" and r.applies]

    def headline(self) -> str:
        """One line: verdict and counts."""
        n = len(self.results)
        if not self.comparable:
            return (
                f"NOT COMPARABLE: {'; '.join(n.split(';')[0] for n in self.notes)}: no regression verdict (the "
                "rules cannot tell a changed setup from a regression; --allow-setup-change to judge anyway)"
            )
        if self.strict and self.strict_skips and not self.regressed:
            names = ", ".join(r.rule for r in self.strict_skips)
            return f"FAILED (--strict): {len(self.strict_skips)} of {n} rules skipped ({names})"
        if self.regressed:
            names = ", ".join(r.rule for r in self.failed)
            return f"REGRESSION: {len(self.failed)} of {n} rules failed ({names})"
        extra = f", {len(self.skipped)} skipped" if self.skipped else ""
        return f"OK: no regression ({n - len(self.skipped)} of {n} rules passed{extra})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`--format json`)."""
        return {
            "baseline": self.baseline_label,
            "current": self.current_label,
            "regression": self.regressed if self.comparable else None,
            "comparable": self.comparable,
            "exit_code": self.exit_code,
            "results": [_json_result(r) for r in self.results],
            "notes": list(self.notes),
            "strict": self.strict,
            "rules": asdict(self.rules),
        }


def _json_result(r: RuleResult) -> dict[str, Any]:
    """A rule's result for JSON: shares and MFU as fractions (as in summary.json: `mfu.value` 0.38, not 38),
    their change as a difference of fractions; percent is for the text formats, with a % sign."""
    d = asdict(r)
    if d["unit"] == "%":
        for k in ("baseline", "current"):
            d[k] = None if d[k] is None else d[k] / 100.0
        d["unit"] = "fraction"
        if d["delta_unit"] == "pts":
            d["delta"] = None if d["delta"] is None else d["delta"] / 100.0
            d["delta_unit"] = "fraction"
    return d


# ----------------------------------------------------------------------------------------------------------
# Per-step samples


_PER_STEP_FIELDS = (
    "step_time_ms",
    "compute_ms",
    "exposed_comm_ms",
    "overlapped_comm_ms",
    "memcpy_ms",
    "idle_ms",
    "bubble_ms",
)


def _per_step_arrays(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Column arrays of `per_step` rows (null -> NaN; a null step, a run without step markers, -> -1).

    Converted column by column through Arrow (fast for 10^5 rows). Raises ValueError naming the first
    bad row; `validate_summary` turns it into a BadInputError.
    """
    import pyarrow as pa

    memo = _ARRAYS_MEMO.get()
    if memo is not None and id(rows) in memo and memo[id(rows)][0] is rows:
        return memo[id(rows)][1]
    cols: dict[str, np.ndarray] = {}
    try:
        if not all(isinstance(r, dict) and r.get("rank") is not None for r in rows):
            raise ValueError("rank missing")
        cols["rank"] = pa.array([r["rank"] for r in rows], pa.int64()).to_numpy()
        step = pa.array([r.get("step") for r in rows], pa.int64()).fill_null(-1)
        cols["step"] = step.to_numpy()
        for name in _PER_STEP_FIELDS:
            arr = pa.array([r.get(name) for r in rows], pa.float64())
            cols[name] = arr.to_numpy(zero_copy_only=False)  # nulls -> NaN
    except (pa.ArrowException, KeyError, TypeError, ValueError) as err:
        bad = next((i for i, r in enumerate(rows) if not _row_ok(r)), 0)
        raise ValueError(f"per_step[{bad}] is malformed ({type(err).__name__}: {err})") from err
    if memo is not None:
        memo[id(rows)] = (rows, cols)
    return cols


def _row_ok(row: Any) -> bool:
    """Whether one per_step row has an integer rank and numeric-or-null values (for the error message)."""
    try:
        int(row["rank"])
        _ = None if row.get("step") is None else int(row["step"])
        for name in _PER_STEP_FIELDS:
            value = row.get(name)
            if value is not None and (isinstance(value, (str, bool)) or not isinstance(value, (int, float))):
                return False
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return True


def _per_step_columns(summary: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """Column arrays (rank, step, *_ms as float with NaN for null) of `per_step`, complete steps only.

    A step is complete when every rank seen in `per_step` reported it; partial steps (a rank's trace
    ended early) would bias a max or a sum, so they are dropped unless no step is complete.
    """
    rows = summary.get("per_step")
    if not rows:
        return None
    cols = _per_step_arrays(rows)
    steps, inverse = np.unique(cols["step"], return_inverse=True)
    n_ranks = np.unique(cols["rank"]).size
    counts = np.bincount(inverse, minlength=steps.size)
    complete = counts[inverse] == n_ranks
    if complete.any() and not complete.all():
        cols = {k: v[complete] for k, v in cols.items()}
    return cols


def _group_by_step(cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sort order and group start offsets of rows by step (for np.*.reduceat)."""
    order = np.argsort(cols["step"], kind="stable")
    sorted_steps = cols["step"][order]
    starts = np.flatnonzero(np.r_[True, sorted_steps[1:] != sorted_steps[:-1]])
    return order, starts


def step_time_samples(summary: dict[str, Any], aggregate: str = "max") -> np.ndarray | None:
    """One step time (ms) per step: the max (or median) over ranks of `per_step[].step_time_ms`.

    Max is the default because a synchronous job advances at the pace of its slowest rank: that is
    the time each step costs. None when the summary has no usable per-step samples.
    """
    cols = _per_step_columns(summary)
    if cols is None:
        return None
    values = cols["step_time_ms"]
    keep = np.isfinite(values)
    if not keep.any():
        return None
    cols = {k: v[keep] for k, v in cols.items()}
    order, starts = _group_by_step(cols)
    v = cols["step_time_ms"][order]
    if aggregate == "max":
        return np.maximum.reduceat(v, starts)
    bounds = np.r_[starts, v.size]
    return np.array([np.median(v[a:b]) for a, b in itertools.pairwise(bounds)])


def share_samples(summary: dict[str, Any], part: str) -> np.ndarray | None:
    """Per-step share of step time spent in `part` (percent): sum over ranks of part / of step time.

    Summing over ranks weighs each rank by its time, so the share is that of all GPU-time in the
    step. None when the part or the step time is missing for every step.
    """
    cols = _per_step_columns(summary)
    if cols is None:
        return None
    keep = np.isfinite(cols[part]) & np.isfinite(cols["step_time_ms"])
    if not keep.any():
        return None
    cols = {k: v[keep] for k, v in cols.items()}
    order, starts = _group_by_step(cols)
    num = np.add.reduceat(cols[part][order], starts)
    den = np.add.reduceat(cols["step_time_ms"][order], starts)
    ok = den > 0
    if not ok.any():
        return None
    return 100.0 * num[ok] / den[ok]


def mann_whitney_greater(current: np.ndarray, baseline: np.ndarray) -> float:
    """One-sided Mann-Whitney U p-value for "current tends to be larger than baseline"."""
    from scipy.stats import mannwhitneyu

    p = float(mannwhitneyu(current, baseline, alternative="greater", method="auto").pvalue)
    return p if math.isfinite(p) else 1.0  # all values tied: no evidence of an increase


def min_p_value(n1: int, n2: int) -> float:
    """Smallest one-sided p-value the exact Mann-Whitney test can reach with n1 and n2 samples."""
    return 1.0 / math.comb(n1 + n2, n1)


def _steps_needed(alpha: float) -> int:
    """Smallest equal number of steps per run with which the test can reach p < alpha."""
    n = 2
    while min_p_value(n, n) >= alpha:
        n += 1
    return n


# ----------------------------------------------------------------------------------------------------------
# Rules


def _skip(rule: str, title: str, why: str, **kw: Any) -> RuleResult:
    return RuleResult(rule=rule, title=title, status="skip", message=why, **kw)


def _significance_gate(
    rule: str, title: str, base: np.ndarray, cur: np.ndarray, alpha: float, **kw: Any
) -> tuple[float | None, RuleResult | None]:
    """Mann-Whitney p-value, or a skip result when the samples are too few to ever reach `alpha`."""
    n_b, n_c = base.size, cur.size
    if min(n_b, n_c) < 2 or min_p_value(n_b, n_c) >= alpha:
        return None, _skip(
            rule,
            title,
            f"too few steps for a significance test at alpha={alpha:g} "
            f"(baseline {n_b}, current {n_c}; profile at least {_steps_needed(alpha)} steps per run)",
            n_baseline=n_b,
            n_current=n_c,
            **kw,
        )
    return mann_whitney_greater(cur, base), None


def _threshold_only(
    skipped: RuleResult, base: np.ndarray, cur: np.ndarray, over: bool, limit: str, what: str
) -> RuleResult:
    """Few-steps fallback: decide on the threshold alone, beyond the noise bound (docs/ci.md).

    With fewer steps than the test needs, a change fails when it is over the rule's threshold (which
    docs/ci.md states is above run-to-run noise) AND every current step is beyond every baseline
    step (the per-step ranges do not overlap: the change is larger than the spread within each run).
    """
    separated = bool(cur.size and base.size and float(np.min(cur)) > float(np.max(base)))
    status = "fail" if over and separated else "pass"
    if over and not separated:
        why = "over the limit but the per-step ranges overlap (within noise)"
    elif over:
        why = "over the limit and every current step beyond every baseline step"
    else:
        why = "within the limit"
    message = f"{what}, limit {limit.removeprefix('> ')}; {skipped.message}, so threshold only: {why}"
    return replace(
        skipped, status=status, message=message, threshold=f"{limit} (threshold only)", threshold_only=True
    )


def _step_what(aggregate: str) -> str:
    """What the step-time rule compares, said where it is shown: `analyze` shows each rank's mean step time,
    the check a median over steps of one time per step (the slowest rank's, or the ranks' median), so the
    two differ by the step-to-step spread and the rank-to-rank one (docs/ci.md)."""
    per_step = "the slowest rank's" if aggregate == "max" else "the ranks' median"
    return f"median step time (over steps, of {per_step} step time; analyze shows each rank's mean)"


def rule_step_time(baseline: dict[str, Any], current: dict[str, Any], cfg: StepTimeRule) -> RuleResult:
    """Median step time increase > max_increase_pct AND one-sided Mann-Whitney p < alpha -> fail."""
    rule, title = "step_time", f"Step time (median of per-step {cfg.aggregate} over ranks)"
    threshold = f"> +{cfg.max_increase_pct:g}% and p < {cfg.alpha:g}"
    base = step_time_samples(baseline, cfg.aggregate)
    cur = step_time_samples(current, cfg.aggregate)
    if base is None or cur is None:
        missing = _which_missing(base, cur)
        return _skip(rule, title, f"no per-step step times in {missing}", unit="ms", threshold=threshold)
    m_b, m_c = float(np.median(base)), float(np.median(cur))
    common: dict[str, Any] = {
        "baseline": m_b,
        "current": m_c,
        "unit": "ms",
        "threshold": threshold,
        "delta_unit": "%",
    }
    if m_b <= 0:
        return _skip(rule, title, "baseline median step time is zero", **common)
    delta = 100.0 * (m_c / m_b - 1.0)
    common["delta"] = delta
    p, skipped = _significance_gate(rule, title, base, cur, cfg.alpha, **common)
    if skipped is not None:
        return _threshold_only(
            skipped,
            base,
            cur,
            delta > cfg.max_increase_pct,
            f"> +{cfg.max_increase_pct:g}%",
            f"{_step_what(cfg.aggregate)} {m_b:.3f} -> {m_c:.3f} ms ({delta:+.1f}%)",
        )
    assert p is not None  # _significance_gate gives a p-value or a skip result
    over, significant = delta > cfg.max_increase_pct, p < cfg.alpha
    status = "fail" if over and significant else "pass"
    message = (
        f"{_step_what(cfg.aggregate)} {m_b:.3f} -> {m_c:.3f} ms ({delta:+.1f}%, limit +{cfg.max_increase_pct:g}%), "
        f"Mann-Whitney p={p:.2g} ({'significant' if significant else 'not significant'} at {cfg.alpha:g}), "
        f"{base.size} vs {cur.size} steps"
    )
    return RuleResult(
        rule, title, status, message, p_value=p, n_baseline=base.size, n_current=cur.size, **common
    )


def _share_rule(
    rule: str,
    title: str,
    part: str,
    baseline: dict[str, Any],
    current: dict[str, Any],
    cfg: ShareRule,
    fallback: Callable[[dict[str, Any], dict[str, Any], ShareRule, str], RuleResult | None] | None,
) -> RuleResult:
    """Shared logic of the exposed-communication and bubble rules (percent of step time, in points)."""
    threshold = f"> +{cfg.max_increase_points:g} pts and p < {cfg.alpha:g}"
    base, cur = share_samples(baseline, part), share_samples(current, part)
    if base is None or cur is None:
        missing = _which_missing(base, cur)
        if fallback is not None:
            result = fallback(baseline, current, cfg, threshold)
            if result is not None:
                return result
        return _skip(rule, title, f"no per-step {part} in {missing}", unit="%", threshold=threshold)
    m_b, m_c = float(np.median(base)), float(np.median(cur))
    delta = m_c - m_b
    common: dict[str, Any] = {
        "baseline": m_b,
        "current": m_c,
        "delta": delta,
        "unit": "%",
        "delta_unit": "pts",
        "threshold": threshold,
    }
    p, skipped = _significance_gate(rule, title, base, cur, cfg.alpha, **common)
    if skipped is not None:
        return _threshold_only(
            skipped,
            base,
            cur,
            delta > cfg.max_increase_points,
            f"> +{cfg.max_increase_points:g} pts",
            f"median {part.removesuffix('_ms').replace('_', ' ')} share {m_b:.2f}% -> {m_c:.2f}% "
            f"of step time ({delta:+.2f} pts)",
        )
    assert p is not None  # _significance_gate gives a p-value or a skip result
    over, significant = delta > cfg.max_increase_points, p < cfg.alpha
    status = "fail" if over and significant else "pass"
    message = (
        f"median {part.removesuffix('_ms').replace('_', ' ')} share {m_b:.2f}% -> {m_c:.2f}% of step time "
        f"({delta:+.2f} pts, limit +{cfg.max_increase_points:g}), Mann-Whitney p={p:.2g} "
        f"({'significant' if significant else 'not significant'} at {cfg.alpha:g}), "
        f"{base.size} vs {cur.size} steps"
    )
    return RuleResult(
        rule, title, status, message, p_value=p, n_baseline=base.size, n_current=cur.size, **common
    )


def rule_exposed_comm(baseline: dict[str, Any], current: dict[str, Any], cfg: ShareRule) -> RuleResult:
    """Exposed-communication share of step time up by > max_increase_points AND significant -> fail."""
    return _share_rule(
        "exposed_comm",
        "Exposed communication share of step time",
        "exposed_comm_ms",
        baseline,
        current,
        cfg,
        None,
    )


def _stage_bubble(summary: dict[str, Any]) -> float | None:
    """Mean over pipeline stages of `stages[].bubble_fraction`, in percent (None without stages)."""
    stages = summary.get("stages") or []
    values: list[Any] = [s.get("bubble_fraction") for s in stages if isinstance(s, dict)]
    values = [float(v) for v in values if v is not None]
    return 100.0 * float(np.mean(values)) if values else None


def _bubble_fallback(
    baseline: dict[str, Any], current: dict[str, Any], cfg: ShareRule, threshold: str
) -> RuleResult | None:
    """Without per-step bubble samples, compare the stages' bubble fractions on the threshold alone."""
    b, c = _stage_bubble(baseline), _stage_bubble(current)
    if b is None or c is None:
        return None
    delta = c - b
    status = "fail" if delta > cfg.max_increase_points else "pass"
    return RuleResult(
        "bubble",
        "Pipeline bubble share of step time",
        status,
        f"mean stage bubble fraction {b:.2f}% -> {c:.2f}% ({delta:+.2f} pts, limit "
        f"+{cfg.max_increase_points:g}); no per-step samples, so threshold only (no significance test)",
        baseline=b,
        current=c,
        delta=delta,
        unit="%",
        delta_unit="pts",
        threshold=f"> +{cfg.max_increase_points:g} pts",
    )


def _pipeline_absent(summary: dict[str, Any]) -> bool:
    """True when the run is known to have at most one pipeline stage (unknown layout: False)."""
    pp = ((summary.get("run") or {}).get("layout") or {}).get("pp")
    if pp is not None:
        return int(pp) <= 1
    stages = summary.get("stages")
    return isinstance(stages, list) and len(stages) == 1


def rule_bubble(baseline: dict[str, Any], current: dict[str, Any], cfg: ShareRule) -> RuleResult:
    """Pipeline-bubble share of step time up by > max_increase_points AND significant -> fail."""
    if _pipeline_absent(baseline) and _pipeline_absent(current):
        return _skip(
            "bubble",
            "Pipeline bubble share of step time",
            "no pipeline parallelism (pp=1) in either run",
            applies=False,
            unit="%",
            threshold=f"> +{cfg.max_increase_points:g} pts and p < {cfg.alpha:g}",
        )
    return _share_rule(
        "bubble", "Pipeline bubble share of step time", "bubble_ms", baseline, current, cfg, _bubble_fallback
    )


def rule_mfu(baseline: dict[str, Any], current: dict[str, Any], cfg: MfuRule) -> RuleResult:
    """MFU drop > max_drop_points percentage points -> fail (threshold only, see docs/ci.md)."""
    rule, title = "mfu", "Model FLOPs utilization"
    threshold = f"drop > {cfg.max_drop_points:g} pts"
    b, c = _mfu_value(baseline), _mfu_value(current)
    if b is None or c is None:
        missing = _which_missing(b, c)
        return _skip(
            rule,
            title,
            f"MFU unknown in {missing} (needs a model config and GPU peak)",
            unit="%",
            threshold=threshold,
        )
    b, c = 100.0 * b, 100.0 * c
    delta = c - b
    status = "fail" if -delta > cfg.max_drop_points else "pass"
    message = f"MFU {b:.2f}% -> {c:.2f}% ({delta:+.2f} pts, limit -{cfg.max_drop_points:g} pts)"
    return RuleResult(
        rule,
        title,
        status,
        message,
        baseline=b,
        current=c,
        delta=delta,
        unit="%",
        delta_unit="pts",
        threshold=threshold,
    )


def _mfu_value(summary: dict[str, Any]) -> float | None:
    """`mfu.value` as a fraction, or None when unknown."""
    mfu = summary.get("mfu")
    if not isinstance(mfu, dict) or mfu.get("value") is None:
        return None
    value = float(mfu["value"])
    return value if math.isfinite(value) else None


def rule_stragglers(baseline: dict[str, Any], current: dict[str, Any], cfg: StragglerRule) -> RuleResult:
    """A rank flagged as straggler in current but not in baseline -> fail."""
    rule, title = "stragglers", "New straggler ranks"
    threshold = "no new straggler"
    b, c = _straggler_ranks(baseline), _straggler_ranks(current)
    if b is None or c is None:
        missing = _which_missing(b, c)
        return _skip(rule, title, f"no straggler analysis in {missing}", threshold=threshold)
    new = sorted(c - b)
    delta = [f"+rank {r}" for r in new] + [f"-rank {r}" for r in sorted(b - c)]
    common: dict[str, Any] = {
        "baseline": sorted(b),
        "current": sorted(c),
        "delta": delta,
        "threshold": threshold,
        "unit": "ranks",
    }
    if not new:
        return RuleResult(
            rule, title, "pass", f"no new straggler (baseline {sorted(b)}, current {sorted(c)})", **common
        )
    details = "; ".join(_straggler_detail(current, r) for r in new)
    return RuleResult(rule, title, "fail", f"new straggler rank(s) {new}: {details}", **common)


def _straggler_ranks(summary: dict[str, Any]) -> set[int] | None:
    stragglers = summary.get("stragglers")
    if stragglers is None:
        return None
    return {int(s["rank"]) for s in stragglers if isinstance(s, dict) and s.get("rank") is not None}


def _straggler_detail(summary: dict[str, Any], rank: int) -> str:
    """Short evidence of one straggler: cause and steps flagged."""
    for s in summary.get("stragglers") or []:
        if isinstance(s, dict) and s.get("rank") is not None and int(s["rank"]) == rank:
            parts = [f"rank {rank} cause={s.get('cause', 'unknown')}"]
            if s.get("steps_flagged") is not None and s.get("steps_total") is not None:
                parts.append(f"flagged in {s['steps_flagged']}/{s['steps_total']} steps")
            return " ".join(parts)
    return f"rank {rank}"  # pragma: no cover


def rule_findings(baseline: dict[str, Any], current: dict[str, Any], cfg: FindingsRule) -> RuleResult:
    """A finding code at one of cfg.severities in current but not in baseline -> fail."""
    rule, title = "findings", f"New {'/'.join(cfg.severities)} findings"
    threshold = f"no new {'/'.join(cfg.severities)} code"
    b, c = _finding_codes(baseline, cfg), _finding_codes(current, cfg)
    if b is None or c is None:
        missing = _which_missing(b, c)
        return _skip(rule, title, f"no findings list in {missing}", threshold=threshold)
    new = sorted(set(c) - set(b))
    common: dict[str, Any] = {
        "baseline": sorted(b),
        "current": sorted(c),
        "delta": [f"+{x}" for x in new],
        "threshold": threshold,
        "unit": "codes",
    }
    if not new:
        return RuleResult(
            rule, title, "pass", "no new finding codes at " + "/".join(cfg.severities), **common
        )
    details = "; ".join(f"{code}: {c[code]}" for code in new)
    return RuleResult(rule, title, "fail", f"new finding(s) {', '.join(new)}: {details}", **common)


def _finding_codes(summary: dict[str, Any], cfg: FindingsRule) -> dict[str, str] | None:
    """code -> first message, for findings at the configured severities and not ignored."""
    findings = summary.get("findings")
    if findings is None:
        return None
    out: dict[str, str] = {}
    for f in findings:
        if not isinstance(f, dict):
            continue
        code = f.get("code")
        if code and f.get("severity") in cfg.severities and code not in cfg.ignore:
            out.setdefault(str(code), " ".join(str(f.get("message", "")).split()))
    return out


def _which_missing(base: Any, cur: Any) -> str:
    """'baseline', 'current', 'baseline and current' or '' depending on which value is None."""
    names = [n for n, v in (("baseline", base), ("current", cur)) if v is None]
    return " and ".join(names)


_RULES: tuple[tuple[str, Callable[[dict[str, Any], dict[str, Any], Any], RuleResult]], ...] = (
    ("step_time", rule_step_time),
    ("mfu", rule_mfu),
    ("exposed_comm", rule_exposed_comm),
    ("bubble", rule_bubble),
    ("stragglers", rule_stragglers),
    ("findings", rule_findings),
)


def check(
    baseline: dict[str, Any],
    current: dict[str, Any],
    rules: Rules | None = None,
    baseline_label: str | None = None,
    current_label: str | None = None,
    strict: bool = False,
    allow_setup_change: bool = False,
) -> CheckReport:
    """Evaluate every enabled rule of `rules` (defaults when None) on two validated summaries.

    `strict`: a skipped rule fails the check (exit code 1) as a regression does. Runs whose setups differ
    (comparability_notes) get no verdict (exit code 2) unless `allow_setup_change`.
    """
    rules = rules or Rules()
    token = _ARRAYS_MEMO.set({})  # each summary's per_step is converted once, not once per rule
    try:
        validate_summary(baseline, baseline_label or "baseline")
        validate_summary(current, current_label or "current")
        results: list[RuleResult] = []
        for name, fn in _RULES:
            cfg = getattr(rules, name)
            if not cfg.enabled:
                continue
            t0 = time.perf_counter()
            result = fn(baseline, current, cfg)
            result.seconds = time.perf_counter() - t0
            results.append(result)
    finally:
        _ARRAYS_MEMO.reset(token)
    notes = comparability_notes(baseline, current)
    if notes and not allow_setup_change:  # no verdict: each rule's numbers are shown, none is judged
        for r in results:
            if r.status != "skip":
                r.message = f"not judged (the setups differ): {r.message}"
            r.status, r.applies = "skip", False
    return CheckReport(
        baseline_label=baseline_label or _run_label(baseline, "baseline"),
        current_label=current_label or _run_label(current, "current"),
        results=results,
        rules=rules,
        notes=notes,
        strict=strict,
        allow_setup_change=allow_setup_change,
    )


def comparability_notes(baseline: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between the runs' setups (known in both): the rules cannot tell that from a regression."""
    b_run, c_run = baseline.get("run") or {}, current.get("run") or {}
    pairs = [("world size", b_run.get("world_size"), c_run.get("world_size"))]
    b_lay, c_lay = b_run.get("layout") or {}, c_run.get("layout") or {}
    pairs += [(axis, b_lay.get(axis), c_lay.get(axis)) for axis in ("tp", "pp", "dp", "cp")]
    pairs += [
        ("GPU", b_run.get("gpu"), c_run.get("gpu")),
        ("seq_len", b_run.get("seq_len"), c_run.get("seq_len")),
    ]
    return [
        f"{what} differs: baseline {b}, current {c}; the runs are not comparable"
        for what, b, c in pairs
        if b is not None and c is not None and b != c
    ]


def _run_label(summary: dict[str, Any], default: str) -> str:
    run = summary.get("run") or {}
    return str(run.get("name") or run.get("path") or default)
