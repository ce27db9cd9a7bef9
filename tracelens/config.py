"""Optional run metadata from `run_dir/tracelens.toml`; CLI flags override it (`RunConfig.merged`).

```toml
[parallel]
tp = 4
pp = 4
dp = 2
cp = 1
order = "tp-cp-dp-pp"   # Megatron order: the first letter varies fastest
[training]
seq_len = 4096
global_batch = 512
microbatches = 8
schedule = "1f1b"        # gpipe | 1f1b | interleaved_1f1b | looped_bfs | interleaved_zero_bubble | zbv_zero_bubble | dualpipe_v
virtual_stages = 2       # model chunks per rank (interleaved); read from layers / P2P when absent
[model]
config = "qwen3.5-27b"   # a preset name or a config.json path (relative paths: from run_dir)
[hardware]
gpu = "H100"
peak_tflops = 989
```
Every key is optional; a missing file gives a RunConfig of Nones. Unknown keys and wrong types raise
BadConfigError (a typo must not be silently ignored).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from tracelens.errors import BadConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FILE_NAME = "tracelens.toml"
#: Pipeline schedules `[training] schedule` may name (analyze/pipeline/schedule.py), and the older spellings it takes.
SCHEDULES = (
    "gpipe",
    "1f1b",
    "interleaved_1f1b",
    "looped_bfs",
    "interleaved_zero_bubble",
    "zbv_zero_bubble",
    "dualpipe_v",
)
SCHEDULE_ALIASES = {"interleaved": "interleaved_1f1b", "zbv": "zbv_zero_bubble", "dualpipev": "dualpipe_v"}

# section -> key -> (field name, accepted python types)
_KEYS: dict[str, dict[str, tuple[str, tuple[type, ...]]]] = {
    "parallel": {
        "tp": ("tp", (int,)),
        "pp": ("pp", (int,)),
        "dp": ("dp", (int,)),
        "cp": ("cp", (int,)),
        "order": ("order", (str,)),
    },
    "training": {
        "seq_len": ("seq_len", (int,)),
        "global_batch": ("global_batch", (int,)),
        "microbatches": ("microbatches", (int,)),
        "schedule": ("schedule", (str,)),
        "virtual_stages": ("virtual_stages", (int,)),
    },
    "model": {"config": ("model", (str,)), "layer_pattern": ("layer_pattern", (str,))},
    "hardware": {"gpu": ("gpu", (str,)), "peak_tflops": ("peak_tflops", (int, float))},
}


@dataclass(frozen=True)
class RunConfig:
    """What the user told us about a run; None = not given."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    order: str | None = None
    seq_len: int | None = None
    global_batch: int | None = None
    microbatches: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None  # [training] virtual_stages: model chunks per rank (interleaved)
    model: str | None = None
    layer_pattern: str | None = None  # regex with groups (?P<layer>) and (?P<module>): layer annotations
    gpu: str | None = None
    peak_tflops: float | None = None
    thresholds: dict[str, float] | None = None  # [thresholds]: verdict thresholds (tracelens.thresholds)
    path: str | None = None  # the toml file read, if any

    @property
    def has_layout(self) -> bool:
        """True when any parallel degree was given (enough to build a grid with defaults for the rest)."""
        return any(v is not None for v in (self.tp, self.pp, self.dp, self.cp))

    def merged(self, **overrides: Any) -> RunConfig:
        """A copy where every non-None override wins (CLI flags over the file)."""
        known = {f.name for f in fields(self)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"unknown RunConfig field(s) {bad}")
        out = replace(self, **{k: v for k, v in overrides.items() if v is not None})
        _validate(out)
        return out


def _validate(cfg: RunConfig) -> None:
    for key in ("tp", "pp", "dp", "cp", "seq_len", "global_batch", "microbatches", "virtual_stages"):
        v = getattr(cfg, key)
        if v is not None and v < 1:
            raise BadConfigError(f"{key} must be a positive integer, got {v}")
    if cfg.peak_tflops is not None and cfg.peak_tflops <= 0:
        raise BadConfigError(f"peak_tflops must be positive, got {cfg.peak_tflops}")
    if cfg.schedule is not None and cfg.schedule not in SCHEDULES:
        raise BadConfigError(f"unknown schedule '{cfg.schedule}' (known: {', '.join(SCHEDULES)})")


def parse_config(text: str, base_dir: Path | None = None, source: str = FILE_NAME) -> RunConfig:
    """RunConfig from TOML text; a relative `[model] config` path that exists under base_dir is resolved."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadConfigError(f"{source}: invalid TOML ({exc})") from None
    values: dict[str, Any] = {}
    for section, body in data.items():
        if section == "thresholds":  # names and values checked by tracelens.thresholds.from_config
            if not isinstance(body, dict):
                raise BadConfigError(f"{source}: [thresholds] must be a table")
            from tracelens.thresholds import from_config

            from_config(body, source)
            values["thresholds"] = dict(body)
            continue
        if section not in _KEYS:
            raise BadConfigError(f"{source}: unknown section [{section}] (known: {', '.join(_KEYS)})")
        if not isinstance(body, dict):
            raise BadConfigError(f"{source}: [{section}] must be a table")
        for key, val in body.items():
            if key not in _KEYS[section]:
                known = ", ".join(_KEYS[section])
                raise BadConfigError(f"{source}: unknown key '{key}' in [{section}] (known: {known})")
            name, types = _KEYS[section][key]
            if isinstance(val, bool) or not isinstance(val, types):
                want = " or ".join(t.__name__ for t in types)
                raise BadConfigError(f"{source}: [{section}] {key} must be {want}, got {val!r}")
            values[name] = val
    if "schedule" in values:
        name = values["schedule"].lower().replace("-", "_")
        values["schedule"] = SCHEDULE_ALIASES.get(name, name)
    if "peak_tflops" in values:
        values["peak_tflops"] = float(values["peak_tflops"])
    if "model" in values and base_dir is not None:
        cand = Path(values["model"]).expanduser()
        if not cand.is_absolute() and (base_dir / cand).exists():
            values["model"] = str((base_dir / cand).resolve())
    cfg = RunConfig(path=source, **values)
    try:
        _validate(cfg)
    except BadConfigError as exc:
        raise BadConfigError(f"{source}: {exc}") from None
    return cfg


def load_run_config(run_dir: str | Path) -> RunConfig:
    """Read `run_dir/tracelens.toml` (or the file itself when given); an absent file gives RunConfig()."""
    p = Path(run_dir)
    path = p if p.is_file() and p.name.endswith(".toml") else p / FILE_NAME
    if not path.is_file():
        return RunConfig()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadConfigError(f"cannot read {path}: {exc}") from None
    return parse_config(text, base_dir=path.parent, source=str(path))


def read_run_config(run_dir: str | Path) -> dict:
    """`run_dir/tracelens.toml` as analysis options: {layout: "tp=4,pp=4,dp=2,cp=1" | None, order, model,
    seq_len, global_batch, microbatches, schedule, peak_tflops, gpu}; {} when there is no file."""
    cfg = load_run_config(run_dir)
    if cfg.path is None:
        return {}
    degrees = [f"{a}={getattr(cfg, a)}" for a in ("tp", "pp", "dp", "cp") if getattr(cfg, a) is not None]
    return {
        "layout": ",".join(degrees) or None,
        "order": cfg.order,
        "model": cfg.model,
        "seq_len": cfg.seq_len,
        "global_batch": cfg.global_batch,
        "microbatches": cfg.microbatches,
        "schedule": cfg.schedule,
        "virtual_stages": cfg.virtual_stages,
        "peak_tflops": cfg.peak_tflops,
        "gpu": cfg.gpu,
        "layer_pattern": cfg.layer_pattern,
        "thresholds": cfg.thresholds,
    }
