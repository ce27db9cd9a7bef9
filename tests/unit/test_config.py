"""tracelens.toml reading: sections, types, overrides, errors."""

from __future__ import annotations

import pytest

from tracelens.analyze.layout import parse_layout
from tracelens.config import RunConfig, load_run_config, parse_config, read_run_config
from tracelens.errors import BadConfigError

FULL = """
[parallel]
tp = 4
pp = 4
dp = 2
cp = 1
order = "tp-cp-dp-pp"
[training]
seq_len = 4096
global_batch = 512
microbatches = 8
schedule = "1F1B"
[model]
config = "model.json"
[hardware]
gpu = "H100"
peak_tflops = 989
"""


def test_full_file(tmp_path):
    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "tracelens.toml").write_text(FULL)
    cfg = load_run_config(tmp_path)
    assert (cfg.tp, cfg.pp, cfg.dp, cfg.cp, cfg.order) == (4, 4, 2, 1, "tp-cp-dp-pp")
    assert (cfg.seq_len, cfg.global_batch, cfg.microbatches, cfg.schedule) == (4096, 512, 8, "1f1b")
    assert cfg.model == str((tmp_path / "model.json").resolve())
    assert cfg.gpu == "H100" and cfg.peak_tflops == 989.0
    assert cfg.has_layout


def test_absent_file_and_presets(tmp_path):
    assert load_run_config(tmp_path) == RunConfig()
    assert not RunConfig().has_layout
    assert parse_config('[model]\nconfig = "qwen3.5-27b"\n', base_dir=tmp_path).model == "qwen3.5-27b"


def test_overrides_win():
    cfg = parse_config("[parallel]\ntp = 2\npp = 2\n").merged(tp=8, pp=None, seq_len=262144)
    assert (cfg.tp, cfg.pp, cfg.seq_len) == (8, 2, 262144)
    with pytest.raises(BadConfigError):
        RunConfig().merged(tp=0)


@pytest.mark.parametrize(
    "text",
    [
        "[parallel]\ntp = 'four'\n",
        "[parallel]\ntpp = 4\n",
        "[trainin]\nseq_len = 1\n",
        "[training]\nschedule = 'zb'\n",
        "[training]\nseq_len = 0\n",
        "[parallel]\ntp = true\n",
        "[parallel\n",
    ],
)
def test_bad_files_raise(text):
    with pytest.raises(BadConfigError):
        parse_config(text)


def test_read_run_config_gives_analysis_options(tmp_path):
    assert read_run_config(tmp_path) == {}
    (tmp_path / "tracelens.toml").write_text("[parallel]\ntp = 4\npp = 2\n[training]\nseq_len = 8192\n")
    opts = read_run_config(tmp_path)
    assert opts["layout"] == "tp=4,pp=2" and opts["seq_len"] == 8192 and opts["model"] is None
    assert parse_layout(opts["layout"]) == {"tp": 4, "pp": 2, "dp": None, "cp": None}
