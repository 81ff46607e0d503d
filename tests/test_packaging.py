import json
import os
import re
import subprocess
import sys
import sysconfig

import pytest
import tomllib
import yaml

from helpers.paths import REPO

# accelerate is not listed: transformers itself imports it when it is installed.
FORBIDDEN = ("deepspeed", "datasets", "duocal", "typer", "matplotlib", "rich")


def test_runtime_imports_nothing_heavy():
    code = (
        "import sys, duocal_runtime\n"
        "[getattr(duocal_runtime, name) for name in duocal_runtime.__all__]  # every public name loads\n"
        f"bad = sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_runtime_source_never_imports_duocal():
    for path in (REPO / "runtime").rglob("*.py"):
        text = path.read_text()
        for name in FORBIDDEN:
            pattern = rf"^\s*(import|from)\s+{name}(\s|\.|$)"
            assert not re.search(pattern, text, re.M), f"{path} imports {name}"


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    dirs = config["package-dir"]
    mapped_folders = {REPO / folder for folder in dirs.values()}
    for package, folder in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            if any(
                init.parent != REPO / folder and init.parent.is_relative_to(m) and m != REPO / folder
                for m in mapped_folders
            ):
                continue  # a sub-folder mapped to its own package name
            name = ".".join([package, *init.parent.relative_to(REPO / folder).parts])
            assert name in listed, f"{name} ({init.parent}) is missing from pyproject's packages list"


@pytest.mark.slow
def test_recipes_resolve_from_an_installed_wheel(tmp_path):
    """The wheel carries the recipes, DeepSpeed configs and shipped profiles: installed in a fresh venv
    (dependencies borrowed from this one, the source tree out of reach), `duocal calibrate NAME` resolves them
    and an upstream pattern pulls offline."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("duocal-*.whl")
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    python = fresh / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
    )
    site = next((fresh / "lib").glob("python*/site-packages"))
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # its .pth files are not run
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    where = subprocess.run(
        [str(python), "-c", "import duocal, duocal.recipes; print(duocal.__file__)"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip().startswith(str(site))  # the wheel's copy, not the checkout
    kernels = "from duocal_runtime.quant import kernels as CK; import shutil; "
    kernels += "assert CK.library() or not shutil.which('cc'); print(CK.SOURCE)"  # built where a compiler is
    built = subprocess.run([str(python), "-c", kernels], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    assert built.stdout.strip().startswith(str(site))  # the C kernels ship in the wheel and build there
    listed = subprocess.run(
        [str(fresh / "bin" / "duocal"), "recipes", "list", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    names = {r["name"]: r["path"] for r in json.loads(listed.stdout)}
    assert "calibrate_smollm2_135m" in names and names["calibrate_demo"].startswith(str(site))
    run = subprocess.run(
        [
            str(fresh / "bin" / "duocal"),
            "calibrate",
            "calibrate_smollm2_135m",
            "model.name_or_path=demo",
            "--dry-run",
            "--output",
            str(tmp_path / "run"),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["deepspeed"]["config"].startswith(str(site)) and config["source"].startswith(str(site))
    offline = {**env, "HF_HUB_OFFLINE": "1", "DUOCAL_CACHE_DIR": str(tmp_path / "cache")}
    pulled = subprocess.run(  # an upstream pattern ships in the wheel: it loads with no network
        [str(fresh / "bin" / "duocal"), "profiles", "pull", "duo-attention/Meta-Llama-3.1-8B-Instruct"],
        cwd=cwd,
        env=offline,
        capture_output=True,
        text=True,
    )
    assert pulled.returncode == 0, pulled.stderr


def make_setup_commands(tmp_path, *assignments: str) -> list[str]:
    """What `make setup` would run (dry run, forced) into a scratch venv path."""
    dry = subprocess.run(
        ["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}", *assignments],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return dry.stdout.splitlines()


def test_setup_takes_the_cpu_torch_index_when_asked_and_says_how(tmp_path):
    cpu_index = "https://download.pytorch.org/whl/cpu"
    plain = [line for line in make_setup_commands(tmp_path) if "pip install" in line]
    assert len(plain) == 1 and "-c constraints.txt" in plain[0] and "--extra-index-url" not in plain[0], plain
    chosen = [line for line in make_setup_commands(tmp_path, f"TORCH_INDEX={cpu_index}") if "pip install" in line]
    assert len(chosen) == 1 and f"--extra-index-url {cpu_index} -c constraints.txt" in chosen[0], chosen
    comments = "\n".join(line for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("#"))
    assert f"--extra-index-url {cpu_index}" in comments and f"make setup TORCH_INDEX={cpu_index}" in comments
    assert "CUDA" in comments and "torch==2.13.0" in (REPO / "constraints.txt").read_text().splitlines()
