"""Run every install instruction of README.md and docs/*.md verbatim in a fresh checkout copy and venv.

CI (`.ci/run`) calls this after the test suite. It builds the wheel (`dist/tracelens_train-*.whl`), then
for each install instruction that installs this project:

- copies the tracked files of the checkout (and `dist/`) into a fresh temporary folder, so `.venv` and
  relative paths (`-e .`, `dist/...whl`) mean what they mean to a user who just cloned the repository;
- runs the instruction's install part verbatim with bash (up to and including its last `pip install`:
  what follows, such as running the test suite, is what the rest of CI already runs). An instruction
  that does not make its own venv runs with a fresh venv first on PATH;
- checks that the venv now has the distribution `tracelens-train`, that `import tracelens` comes from
  it (not from the checkout on PYTHONPATH) and that the `tracelens` command runs.

Offline-friendly: the project itself comes from the checkout or the built wheel; dependencies come from
whatever pip is configured with (`PIP_INDEX_URL`, or `PIP_NO_INDEX=1 PIP_FIND_LINKS=wheelhouse/`).
The `record` extra pins torch (hundreds of MB): it is resolved with `--dry-run` unless
TRACELENS_INSTALL_CHECK_RECORD=1.

Instructions that install the same thing (the same source, `-e .`, the wheel or the index, with the same
extras) are checked by one fresh install, and an install is covered by a fresh install of the same files
(this checkout, or the built wheel) with more extras (its requirements are a subset of what that one
resolved); the installs with the most extras run first; `--ci-ran-tests` (.ci/run) also
counts the README's test command, which .ci/run has just run verbatim in a fresh venv. Distinct installs run two at a time (`--jobs`), with
`PIP_NO_COMPILE=1` (pip does not byte-compile what it installs: the same files, in less time).

    python scripts/check_install_docs.py            # all instructions
    python scripts/check_install_docs.py --list     # only print what would run (and each target)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIST_NAME = "tracelens-train"
#: install lines naming other projects (HTA's own venv for the golden files) are not ours to check
FOREIGN = ("HolisticTraceAnalysis",)
_PIP = re.compile(r"(?:^|[\s/`])pip install ")


def doc_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def install_instructions(repo: Path = REPO) -> list[tuple[str, str]]:
    """(file:line, command) for every `pip install` of this project in README.md and docs/*.md.

    A command is a whole line of a code block, or an inline `code span` of prose; YAML `- run:` steps
    count too. Duplicates (same command) are kept once.
    """
    out: dict[str, str] = {}
    for path in doc_files(repo):
        in_block = False
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip().startswith("```"):
                in_block = not in_block
                continue
            where = f"{path.relative_to(repo)}:{i}"
            if in_block:
                cmds = [line.strip()]
                if cmds[0].startswith("- run:"):
                    cmds = [cmds[0].removeprefix("- run:").strip()]
            else:
                cmds = re.findall(r"`([^`]*pip install [^`]*)`", line)
            for cmd in cmds:
                cmd = cmd.split("  #")[0].strip()
                if _PIP.search(" " + cmd) and not any(f in cmd for f in FOREIGN):
                    out.setdefault(cmd, where)
    return [(where, cmd) for cmd, where in out.items()]


def install_part(cmd: str) -> str:
    """The command up to and including its last `&&`-separated part that runs pip install."""
    parts = cmd.split(" && ")
    last = max(i for i, p in enumerate(parts) if "pip install" in p)
    return " && ".join(parts[: last + 1])


def install_target(part: str) -> tuple[str, tuple[str, ...]]:
    """What an install instruction installs: (source, extras). Source is `editable` (`-e .`), `wheel`
    (`dist/...whl`) or `index` (the distribution name, e.g. with `--find-links dist/`). Two instructions
    with the same target install the same thing: one fresh install checks both."""
    pip = part.split(" && ")[-1]
    if re.search(r"-e\s+['\"]?\.", pip):
        source = "editable"
    elif "dist/" in pip and ".whl" in pip:
        source = "wheel"
    else:
        source = "index"
    m = re.search(r"\[([a-z0-9_,\- ]+)\]", pip)
    extras = tuple(sorted(x.strip() for x in m.group(1).split(","))) if m else ()
    return source, extras


def covered_by(target: tuple[str, tuple[str, ...]], seen: dict[tuple, str]) -> str | None:
    """Why a fresh install of `target` would check nothing new, or None: the same target was installed, or
    one from the same files (`_same_files`) with every extra of it and more: its requirements are a subset of
    what that fresh install resolved and installed."""
    if target in seen:
        return f"same install as {seen[target]}"
    source, extras = target
    for (s2, e2), where in seen.items():
        if _same_files(source, s2) and set(extras) < set(e2):
            return f"covered by the install of {where} (its extras {list(e2)} include {list(extras)})"
    return None


def _same_files(a: str, b: str) -> bool:
    """Two sources install the same files: both this checkout (editable), or both the built wheel (`dist/*.whl`
    directly, or by name with `--find-links dist/`)."""
    return a == b or {a, b} == {"wheel", "index"}


def ci_test_command(repo: Path = REPO) -> str:
    """The README's test command (the second line of its first code block), which `.ci/run` runs itself."""
    lines = repo.joinpath("README.md").read_text(encoding="utf-8").split("```")[1].strip().splitlines()
    return lines[1].strip()


def _venv_of(cmd: str) -> str | None:
    m = re.search(r"python3? -m venv (\S+)", cmd)
    return m.group(1) if m else None


def build_wheel(repo: Path = REPO) -> Path:
    """Build the wheel into `repo/dist/` from a fresh copy of the tracked files (the build's `build/` and
    egg-info go there, not into the checkout, where .ci/run installs and tests at the same time)."""
    dist = repo / "dist"
    dist.mkdir(exist_ok=True)
    for old in dist.glob("tracelens_train-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="tracelens-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        fresh_copy(src, repo, with_dist=False)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "-q",
                "-w",
                str(Path(tmp) / "dist"),
                str(src),
            ],
            check=True,
        )
        (built,) = (Path(tmp) / "dist").glob("tracelens_train-*.whl")
        shutil.copy2(built, dist / built.name)
    return dist / built.name


def fresh_copy(dest: Path, repo: Path = REPO, with_dist: bool = True) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=repo, check=True, capture_output=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (repo / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, dest / rel)
    if with_dist and (repo / "dist").is_dir():
        shutil.copytree(repo / "dist", dest / "dist", dirs_exist_ok=True)


def run_one(where: str, cmd: str) -> str:
    """Run one instruction's install part in a fresh copy and venv; the log of what it did."""
    log: list[str] = []
    part = install_part(cmd)
    if "[record]" in part and os.environ.get("TRACELENS_INSTALL_CHECK_RECORD") != "1":
        part += " --dry-run"
    with tempfile.TemporaryDirectory(prefix="tracelens-install-") as tmp:
        root = Path(tmp) / "tracelens"
        root.mkdir()
        fresh_copy(root)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        # what is installed is the same; only pip's byte-compiling of every installed module (a large part
        # of an install's time) is left to the first import
        env.setdefault("PIP_NO_COMPILE", "1")
        venv = _venv_of(part)
        if venv is None:  # "pip install ..." alone: the user is inside some venv; give it a fresh one
            venv = "../venv"
            subprocess.run([sys.executable, "-m", "venv", str(root / venv)], check=True)
            env["PATH"] = f"{(root / venv / 'bin').absolute()}{os.pathsep}{env.get('PATH', '')}"
        log.append(f"[{where}] $ {part}")
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", part], cwd=root, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit("\n".join([*log, done.stdout[-3000:], done.stderr[-3000:], f"[{where}] failed"]))
        if part.endswith("--dry-run"):
            return "\n".join([*log, "    ok: resolves (--dry-run)"])
        py = (root / venv / "bin" / "python").absolute()  # not resolve(): the venv's python is a symlink
        probe = (
            "import importlib.metadata as m, tracelens; "
            f"print(m.version('{DIST_NAME}'), tracelens.__version__, tracelens.__file__)"
        )
        got = subprocess.run(
            [str(py), "-c", probe], cwd="/", env=env, check=True, capture_output=True, text=True
        ).stdout.split()
        assert got[0] == got[1], f"{DIST_NAME} {got[0]} but tracelens.__version__ {got[1]}"
        subprocess.run(
            [str(py.parent / "tracelens"), "--help"], cwd="/", env=env, check=True, capture_output=True
        )
        log.append(f"    ok: {DIST_NAME} {got[0]}, import tracelens from {got[2]}")
    return "\n".join(log)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the instructions and exit")
    ap.add_argument(
        "--where", help="only the instructions whose file:line contains this (e.g. docs/scale.md)"
    )
    ap.add_argument(
        "--ci-ran-tests",
        action="store_true",
        help="the README's test command already ran verbatim (.ci/run): its install target is not repeated",
    )
    ap.add_argument("--jobs", type=int, default=2, help="fresh installs run at once (default 2)")
    args = ap.parse_args()
    found = [(w, c) for w, c in install_instructions() if not args.where or args.where in w]
    if args.list:
        for where, cmd in found:
            print(f"{where}: {install_part(cmd)}  -> {install_target(install_part(cmd))}")
        return 0
    seen: dict[tuple, str] = {}
    if args.ci_ran_tests:
        seen[install_target(install_part(ci_test_command()))] = "README.md (the test command .ci/run ran)"
    todo = []
    # the installs with the most extras first: one with fewer extras from the same files is then covered
    for where, cmd in sorted(found, key=lambda wc: -len(install_target(install_part(wc[1]))[1])):
        target = install_target(install_part(cmd))
        covered = covered_by(target, seen)
        if covered:
            print(f"[{where}] {covered}: {install_part(cmd)}")
            continue
        seen[target] = where
        todo.append((where, cmd))
    print(f"built {build_wheel().name}", flush=True)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for log in pool.map(lambda wc: run_one(*wc), todo):
            print(log, flush=True)
    print(
        f"{len(found)} install instructions ({len(todo)} distinct installs) ran verbatim and installed {DIST_NAME}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
