"""Install instructions (issue 20, item 1): every one in README.md and docs/ installs THIS project, under
a distribution name nobody else holds; `scripts/check_install_docs.py` (run by .ci/run) runs them all
verbatim in a fresh venv."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "check_install_docs", REPO / "scripts" / "check_install_docs.py"
)
check_install_docs = importlib.util.module_from_spec(spec)
sys.modules["check_install_docs"] = check_install_docs
spec.loader.exec_module(check_install_docs)

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib


def test_distribution_name_is_ours_and_import_name_stays():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == check_install_docs.DIST_NAME == "tracelens-train"
    assert project["scripts"] == {"tracelens": "tracelens.cli:main"}


def test_every_install_instruction_installs_this_project():
    found = check_install_docs.install_instructions()
    cmds = [check_install_docs.install_part(c) for _, c in found]
    assert len(cmds) >= 6, found  # README (tour, tests, install, development), docs/ci.md, scale, recording
    for cmd in cmds:
        # the bare registry name `tracelens` is an unrelated project
        assert not re.search(r"pip install (-\S+ )*['\"]?tracelens(?![-_\w])", cmd), cmd
        # this project: the checkout (-e . / -e '.[extra]'), the built wheel, or tracelens-train from dist/
        local = re.search(r"-e ['\"]?\.", cmd) or "dist/tracelens_train-" in cmd
        assert local or ("tracelens-train" in cmd and "--find-links dist/" in cmd), cmd
    assert any("pip wheel" in c for c in cmds)  # the wheel is built the way the docs say


def test_ci_builds_the_wheel_and_runs_the_instructions_beside_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    readme_test = next(line for line in (REPO / "README.md").read_text().splitlines() if "-m pytest" in line)
    assert readme_test.strip() in ci.splitlines()
    assert "scripts/check_install_docs.py" in ci


def test_an_install_is_covered_only_by_one_of_the_same_files_with_more_extras():
    cov = check_install_docs.covered_by
    seen = {("editable", ("dask", "test")): "README.md:5"}
    assert "same install" in cov(("editable", ("dask", "test")), seen)
    assert "covered by" in cov(("editable", ()), seen) and "covered by" in cov(("editable", ("dask",)), seen)
    assert cov(("editable", ("record",)), seen) is None  # an extra the fresh install did not resolve
    assert cov(("editable", ("dask", "record")), seen) is None
    assert cov(("wheel", ()), seen) is None and cov(("index", ("dask",)), seen) is None  # other files
    wheel = {("index", ("dask",)): "docs/scale.md:66"}  # the built wheel, by name with --find-links dist/
    assert "covered by" in cov(("wheel", ()), wheel) and "covered by" in cov(("index", ()), wheel)
    assert cov(("editable", ()), wheel) is None
