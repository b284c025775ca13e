"""A lesson outside a clone, as a hosted-notebook learner runs it: the install line every lesson's first cell
shows, the README's Colab links from one variable, and a lesson copied alone into an empty folder, run with
papermill from the built wheel installed in a fresh venv (its era built in the cache folder on first use)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from trl_clinic.course import hosted
from trl_clinic.course.eras import local_torch_links, uv_command
from trl_clinic.course.lessons import lessons

ROOT = Path(__file__).resolve().parents[1]
LESSON = "01_padding_free_high_loss"  # its symptom comes from an era: the part a lesson alone lost before
ERA = "01-trl-0.14"


def test_every_lesson_s_first_cell_and_the_readme_say_what_pyproject_says():
    """`python -m trl_clinic.course.hosted` has been run for the current [project.urls] (and `make notebooks`)."""
    for path in hosted.lesson_sources():
        text = path.read_text()
        assert hosted.with_install_line(text, ROOT) == text, f"{path.name}: run python -m trl_clinic.course.hosted"
    for lesson in lessons().values():
        first = nbformat.read(ROOT / "notebooks" / f"{lesson.notebook}.ipynb", as_version=4).cells[0]
        assert first.cell_type == "markdown" and hosted.install_line(ROOT) in first.source, lesson.notebook
    readme = (ROOT / "README.md").read_text()
    assert hosted.with_readme_block(readme, ROOT) == readme, "README: run python -m trl_clinic.course.hosted"


def project_with(tmp_path: Path, urls: str) -> Path:
    text = (ROOT / "pyproject.toml").read_text().replace("[project.scripts]", f"{urls}\n\n[project.scripts]")
    (tmp_path / "pyproject.toml").write_text(text)
    return tmp_path


def test_a_github_repository_gives_a_git_install_line_and_a_colab_link_per_lesson(tmp_path):
    root = project_with(tmp_path, '[project.urls]\nRepository = "https://github.com/someone/trl-clinic"')
    assert (
        hosted.install_command(root) == '%pip install "trl-clinic[course] @ git+https://github.com/someone/trl-clinic"'
    )
    block = hosted.readme_block(root)
    for lesson in lessons().values():
        link = (
            f"https://colab.research.google.com/github/someone/trl-clinic/blob/main/notebooks/{lesson.notebook}.ipynb"
        )
        assert link in block
    assert "upload the wheel" not in hosted.install_line(root)


def test_without_a_url_the_line_installs_the_wheel_and_the_readme_says_how_to_get_links(tmp_path):
    unset = project_with(tmp_path, "")
    assert hosted.install_command(unset) == '%pip install "./trl_clinic-0.1.0-py3-none-any.whl[course]"'
    assert "colab.research.google.com/github" not in hosted.readme_block(unset)
    other = project_with(tmp_path, '[project.urls]\nRepository = "https://gitlab.com/someone/trl-clinic"')
    assert "is not a GitHub repository" in hosted.readme_block(other)


def fresh_venv_with_the_wheel(tmp_path: Path) -> Path:
    """The built wheel with its course extra in a new venv (pip inside, as a hosted notebook has), at the lock's
    versions: unconstrained, a later release would change what the lesson measures between runs of this test."""
    dist = tmp_path / "dist"
    built = subprocess.run([*uv_command(), "build", "--wheel", "--out-dir", str(dist), str(ROOT)], capture_output=True)
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    links = local_torch_links("2.13.0")  # these machines' CPU torch; elsewhere PyPI's
    install = [*uv_command(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
    install += ["--index-strategy", "unsafe-best-match", *(["--find-links", str(links)] if links else [])]
    wheel = next(dist.glob("*.whl"))
    done = subprocess.run(
        [*install, "-c", str(ROOT / "requirements-lock.txt"), f"{wheel}[course]"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return venv


@pytest.mark.notebook
def test_a_lesson_alone_in_an_empty_folder_runs_from_the_wheel_and_builds_its_era(tmp_path):
    venv = fresh_venv_with_the_wheel(tmp_path)
    outside = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "from trl_clinic.course import paths; print(paths.checkout())"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert outside.stdout.strip() == "None", outside  # the wheel, not this checkout
    room = tmp_path / "room"
    room.mkdir()
    shutil.copy(ROOT / "notebooks" / f"{LESSON}.ipynb", room)
    cache = tmp_path / "cache"
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(TRL_CLINIC_CACHE=str(cache), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
    run = subprocess.run(
        [str(venv / "bin" / "papermill"), f"{LESSON}.ipynb", "executed.ipynb", "-p", "profile", "cpu"],
        cwd=room,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((room / "outputs" / LESSON / "metrics.json").read_text())
    (era,) = metrics["eras"]
    assert era["era"] == ERA and era["status"] == "finished", era["message"]
    assert (cache / ".eras" / ERA / ".stamp.json").is_file()  # built on first use, in the cache folder
    assert metrics["symptom_reproduced"] and metrics["fix_verified"] and metrics.get("complete", True)
    executed = nbformat.read(room / "executed.ipynb", as_version=4)
    assert hosted.install_line(ROOT) in executed.cells[0].source
    said = "".join(output.get("text", "") for cell in executed.cells for output in cell.get("outputs", []))
    assert f"era {ERA}: not built yet; building it in {cache / '.eras' / ERA}" in said
