"""The wheel installs only the `quotaledger` namespace and its console script works (DESIGN §1).

Builds the wheel from a copy of the sources, installs it into a fresh venv
(no system site-packages), and runs the console script there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.paths import REPO

pytestmark = pytest.mark.slow

REPO = REPO
SOURCES = ("events", "projections", "engine", "adapters")
TIMEOUT = 180


def _run(
    *argv: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(key, None)
    return env


def _build_wheel(tmp: Path) -> Path:
    """Build from a copy of the sources, so the repository gets no build/ or egg-info."""
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "*.db*")
    for name in SOURCES:
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    out = tmp / "dist"
    env = _clean_env()
    attempts = [
        # Offline first, with the build backend of this environment ...
        (sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, src),
        (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, src),
        # ... else an isolated build (fetches setuptools/wheel from the index).
        (sys.executable, "-m", "build", "--wheel", "--outdir", out, src),
    ]
    errors = []
    for argv in attempts:
        done = _run(*argv, cwd=tmp, env=env)
        wheels = sorted(out.glob("quotaledger-*.whl")) if out.exists() else []
        if done.returncode == 0 and wheels:
            return wheels[0]
        errors.append(f"$ {' '.join(map(str, argv))}\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    pytest.fail("could not build the wheel:\n" + "\n".join(errors))


def _install_msgspec(python: Path, tmp: Path) -> None:
    import msgspec

    env = _clean_env()
    pin = f"msgspec=={msgspec.__version__}"
    done = _run(python, "-m", "pip", "install", "-q", pin, cwd=tmp, env=env)
    if done.returncode == 0:
        return
    # Offline fallback: a wheel of the installed version, built or found locally.
    wheels = tmp / "wheels"
    built = _run(
        sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, pin, cwd=tmp, env=env
    )
    again = _run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--find-links",
        wheels,
        pin,
        cwd=tmp,
        env=env,
    )
    assert again.returncode == 0, "cannot install msgspec into the fresh venv:\n" + "\n".join(
        (done.stderr, built.stderr, again.stderr)
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(wheel, venv, workdir): the built wheel installed into a fresh venv."""
    tmp = tmp_path_factory.mktemp("packaging")
    wheel = _build_wheel(tmp)
    venv = tmp / "venv"
    done = _run(sys.executable, "-m", "venv", venv, cwd=tmp, env=_clean_env())
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    _install_msgspec(python, tmp)
    done = _run(python, "-m", "pip", "install", "-q", "--no-deps", wheel, cwd=tmp, env=_clean_env())
    assert done.returncode == 0, done.stderr
    work = tmp / "work"  # an empty cwd: nothing importable from the repository
    work.mkdir()
    return wheel, venv, work


def test_wheel_holds_only_the_quotaledger_namespace(installed: tuple[Path, Path, Path]) -> None:
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert names
    tops = {name.split("/", 1)[0] for name in names}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert next(iter(dist_info)).startswith("quotaledger-")
    assert tops - dist_info == {"quotaledger"}
    for bare in SOURCES:
        assert not any(name.startswith(f"{bare}/") for name in names), bare
    for package in SOURCES:
        assert f"quotaledger/{package}/__init__.py" in names, package
    for package in SOURCES:
        assert f"quotaledger/{package}/py.typed" in names, package
    assert "quotaledger/adapters/cli/__init__.py" in names
    assert "quotaledger/adapters/cli/__main__.py" in names
    for module in ("__init__", "workload", "fold", "standin"):  # the `bench` command's suites
        assert f"quotaledger/adapters/bench/{module}.py" in names, module
    for page in ("index.html", "app.js", "style.css"):  # package data: the page of `serve`
        assert f"quotaledger/adapters/http/page/{page}" in names, page
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "quotaledger = quotaledger.adapters.cli:main" in text


def test_console_script_help(installed: tuple[Path, Path, Path]) -> None:
    _, venv, work = installed
    done = _run(venv / "bin" / "quotaledger", "--help", cwd=work, env=_clean_env())
    assert done.returncode == 0, done.stderr
    for command in ("replay", "tree", "ingest", "snapshot", "bench"):
        assert command in done.stdout
    assert "examples" in done.stdout


def test_console_script_replays_the_example(installed: tuple[Path, Path, Path]) -> None:
    _, venv, work = installed
    example = REPO / "examples" / "koordinator.jsonl"
    done = _run(
        venv / "bin" / "quotaledger", "replay", example, "--json", cwd=work, env=_clean_env()
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert {"offset", "time", "hash", "cluster", "quotas", "preemptions", "rejected"} <= set(
        document
    )
    assert "research" in document["quotas"]


def test_installed_code_comes_from_the_venv(installed: tuple[Path, Path, Path]) -> None:
    _, venv, work = installed
    done = _run(
        venv / "bin" / "python",
        "-c",
        "import quotaledger.adapters.cli as c, quotaledger.events as e; print(c.__file__); "
        "print(e.__file__)",
        cwd=work,
        env=_clean_env(),
    )
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        assert Path(line).resolve().is_relative_to(venv.resolve()), line


@pytest.mark.parametrize("bare", SOURCES)
def test_no_bare_top_level_packages(bare: str, installed: tuple[Path, Path, Path]) -> None:
    _, venv, work = installed
    done = _run(venv / "bin" / "python", "-c", f"import {bare}", cwd=work, env=_clean_env())
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr
