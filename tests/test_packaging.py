import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(lines):
    return dict(re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line).groups() for line in lines if "==" in line)


def test_environment_yml_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = pins(project["dependencies"] + project["optional-dependencies"]["test"])
    conda = [line.strip().removeprefix("- ").strip() for line in (ROOT / "environment.yml").read_text().splitlines()]
    entries = [line for line in conda if "==" in line and not line.startswith(("#", "python="))]
    assert pins(entries) == expected


def test_every_dependency_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        assert "==" in requirement, requirement


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / "README.md").read_text()
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_makefile_installs_the_uv_that_pyproject_pins():
    """make installs with uv (seconds) and falls back to pip; both read the same pins from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = pins(project["optional-dependencies"]["test"])["uv"]
    assert re.search(rf"^UV := uv=={re.escape(pinned)}$", (ROOT / "Makefile").read_text(), re.M)
