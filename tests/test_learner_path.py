"""The learner's path: a fresh copy of the repository, a lesson opened and run as JupyterLab runs it.

JupyterLab starts the kernel in the notebook's own folder, passes no parameters and no
TRL_CLINIC_PROGRESS (so progress bars show). These tests do the same, with nbclient rather than
papermill, on a copy of the repository's files in a temporary folder, so each run's default output
folder is the copy's ``outputs/<notebook>`` and the real checkout stays untouched. The copy's own
``src`` comes first on the kernel's PYTHONPATH: the kernel runs the copied package, not the editable
install's.

The fastest lesson (by its measured cpu time in lesson.yaml) runs in ``make test``: once from the
repository root, and once through JupyterLab's own UI in headless Chromium (the kernel in the
notebook's folder, as a learner runs it). Every lesson runs from its own folder in ``make test-slow``
(marker ``slow``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import missing
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from trl_clinic.course.launch import free_port
from trl_clinic.course.lessons import lessons

ROOT = Path(__file__).resolve().parents[1]
LESSONS = {lesson.stem: Path("notebooks") / f"{lesson.notebook}.ipynb" for lesson in lessons().values()}
# the core with the shortest measured cpu time (lesson.yaml), so the learner's path costs least in `make test`
FASTEST = min(
    (lesson for lesson in lessons().values() if lesson.is_core), key=lambda lesson: lesson.seconds["cpu"]
).stem
LAST_LINE = "all checks passed"
CELL_TIMEOUT_S = 1800
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def fresh_copy(dest: Path) -> Path:
    """The files a clone would have: tracked ones plus new ones not ignored, as they are in the working
    tree (no outputs/, no .venv, no workbook-output), and the checkout's built eras."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is listed but absent
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    assert (dest / "notebooks" / f"{FASTEST}.ipynb").exists() and not (dest / "outputs").exists()
    # the eras `make lab` builds in the background beside JupyterLab (a learner's lesson waits for them); built once
    # here, so the copy links the checkout's: a lesson whose era is missing is incomplete, never passed
    if (ROOT / ".eras").exists():
        (dest / ".eras").symlink_to((ROOT / ".eras").resolve(), target_is_directory=True)
    return dest


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A fresh copy, and the environment a learner's kernel gets from `make lab`."""
    copy = fresh_copy(tmp_path / "repo")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(copy / "src"), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("TRL_CLINIC_PROGRESS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own inline backend, as in JupyterLab
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('trl_clinic').origin)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(found).is_relative_to(copy / "src"), f"the kernel would import trl_clinic from {found}, not the copy"
    return copy


def text_of(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.append("\n".join(output.traceback))
        elif "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"])
    return "".join(parts)


def execute(notebook: Path, cwd: Path, save_to: Path) -> nbformat.NotebookNode:
    """Run every cell as JupyterLab's Run All does: the notebook's own kernel, started in ``cwd``,
    nothing injected; stops at the first error. The executed notebook is kept in ``save_to``."""
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb, kernel_name=nb.metadata.kernelspec.name, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(cwd)}}
    )
    try:
        client.execute()
    finally:
        nbformat.write(nb, save_to / notebook.name)
    return nb


def assert_default_output_folder(copy: Path, name: str, nb: nbformat.NotebookNode) -> None:
    out = copy / "outputs" / name
    assert out.is_dir(), f"no default output folder {out}; {sorted(p.name for p in copy.iterdir())}"
    metrics = json.loads((out / "metrics.json").read_text())
    failed = [check for group in metrics["checks"].values() for check, result in group.items() if not result["passed"]]
    assert not failed, f"{name}: checks failed: {failed}"
    assert metrics["symptom_reproduced"] and metrics["fix_verified"]
    assert not (copy / "notebooks" / "outputs").exists(), "an outputs/ folder appeared next to the notebooks"
    last = [cell for cell in nb.cells if cell.cell_type == "code"][-1]
    assert LAST_LINE in text_of(last)
    # the learner is told where the outputs went: conclude()'s last line names metrics.json in that folder (a
    # lesson may name it at the top too, with run.describe(), but need not)
    assert str(out / "metrics.json") in text_of(last), (
        f"the last cell does not say where the outputs went:\n{text_of(last)}"
    )


def run_all_from_its_folder(repo: Path, name: str, tmp_path: Path) -> None:
    notebook = repo / LESSONS[name]
    nb = execute(notebook, notebook.parent, tmp_path)
    assert_default_output_folder(repo, name, nb)


def test_fastest_lesson_runs_all_with_the_kernel_at_the_repository_root(repo, tmp_path):
    nb = execute(repo / LESSONS[FASTEST], repo, tmp_path)
    assert_default_output_folder(repo, FASTEST, nb)


@pytest.mark.slow
@pytest.mark.parametrize("name", LESSONS)
def test_every_lesson_runs_all_from_its_own_folder(repo, tmp_path, name):
    run_all_from_its_folder(repo, name, tmp_path)


def test_an_explicit_output_dir_with_a_missing_parent_still_fails_clearly(repo, tmp_path):
    """A learner who types a path whose parent does not exist gets the clear error, and nothing is made."""
    notebook = repo / LESSONS[FASTEST]
    nb = nbformat.read(notebook, as_version=4)
    parameters = next(cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", []))
    assert "output_dir = None" in parameters.source
    parameters.source = parameters.source.replace("output_dir = None", 'output_dir = "missing/lesson_02"')
    edited = tmp_path / "edited"
    edited.mkdir()
    nbformat.write(nb, notebook)
    with pytest.raises(CellExecutionError, match="output_dir's parent folder does not exist"):
        execute(notebook, notebook.parent, edited)
    assert not (notebook.parent / "missing").exists() and not (repo / "outputs").exists()


# ---------------------------------------------------------------------------------------------------
# The same lesson through JupyterLab's UI, in a real browser


def start_lab(root: Path, state: Path, log) -> tuple[subprocess.Popen, str]:
    """JupyterLab as `make lab` starts it, headless, on a free port with a token; its settings,
    workspaces and runtime files in ``state`` so no earlier session's layout leaks in."""
    port, token = free_port(), secrets.token_hex(16)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={state / 'settings'}",
        f"--LabApp.workspaces_dir={state / 'workspaces'}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.getuid() == 0:
        command.append("--ServerApp.allow_root=True")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(state / "runtime")}
    server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {server.returncode} before it served")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as response:
                if response.status == 200:
                    return server, f"{url}/lab/tree/{{path}}?token={token}"
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("JupyterLab did not answer within 120 s")


# Reads the notebook's state from the page: the kernel status and name in its toolbar, the text of any
# open dialog, each code cell's prompt ("[ ]:", "[*]:", "[3]:") and output text. innerText is what a
# learner sees; textContent also covers cells JupyterLab has not rendered because they are scrolled away.
PAGE_STATE = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const cells = [...panel.querySelectorAll('.jp-Cell.jp-CodeCell')].map(cell => ({
    prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
    output: (cell.querySelector('.jp-OutputArea') || {}).textContent || '',
  }));
  const name = panel.querySelector('.jp-Toolbar-kernelName');
  const dialog = document.querySelector('.jp-Dialog');
  return {kernel: indicator ? indicator.getAttribute('data-status') : null,
          kernelName: name ? name.textContent.trim() : null,
          dialog: dialog ? dialog.innerText : null, cells};
}"""


def wait_for(page, predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = page.evaluate(PAGE_STATE)
        if state and predicate(state):
            return state
        page.wait_for_timeout(500)
    raise TimeoutError(f"{what} not within {timeout_s:.0f} s; last page state: {json.dumps(state)[:3000]}")


def test_fastest_lesson_runs_all_in_jupyterlab_in_a_real_browser(repo, tmp_path):
    if not CHROMIUM.exists():
        missing("chromium", f"needs Debian's chromium at {CHROMIUM} (`make browser` installs it when run as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    state = tmp_path / "lab"
    state.mkdir()
    log_path = tmp_path / "jupyterlab.log"
    with open(log_path, "w") as log:
        server, url = start_lab(repo, state, log)
        try:
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                try:
                    last = run_all_in_lab(page, url.format(path=LESSONS[FASTEST].as_posix()))
                except Exception as error:
                    page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
                    raise AssertionError(f"{error}\n{saved_errors(page, repo / LESSONS[FASTEST])}") from error
                finally:
                    browser.close()
        except Exception as error:
            raise AssertionError(
                f"{error}\nscreenshot: {tmp_path / 'failure.png'}\n"
                f"JupyterLab log (tail):\n{log_path.read_text()[-3000:]}"
            ) from error
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    assert LAST_LINE in last
    assert (repo / "outputs" / FASTEST / "metrics.json").exists()


RUN_ALL_ATTEMPTS = 3


def run_all_in_lab(page, url: str) -> str:
    """Open the notebook, wait for its kernel, Run → Run All Cells from the menu bar, wait until the
    kernel is idle with no cell queued, and return the last cell's output text as the page shows it."""
    page.goto(url)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
    # The toolbar says "idle" before the session has its kernel; Run All then asks "Select Kernel".
    wait_for(
        page,
        lambda s: s["kernel"] == "idle" and s["kernelName"] not in (None, "", "No Kernel"),
        180,
        "kernel idle and named after opening the notebook",
    )
    # Run All queues every cell at once ("[*]:"), then they run one by one. On a cold start (a fresh
    # virtual environment, CI) the first click was once taken while the kernel's connection was still
    # settling and queued nothing, with the kernel idle: click again, as a learner would. A dialog in
    # between is answered as a learner would answer it (Select Kernel: the one offered), or named.
    for attempt in range(1, RUN_ALL_ATTEMPTS + 1):
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        label = page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$"))
        page.locator(".lm-Menu-item:visible").filter(has=label).click()
        try:
            state = wait_for(
                page, lambda s: s["dialog"] or queued(s), 30, f"cells queued by Run All (attempt {attempt})"
            )
        except TimeoutError:
            if attempt == RUN_ALL_ATTEMPTS:
                raise
            continue
        finally:
            answer_dialog(page)
        if not queued(state):  # a dialog came first
            wait_for(page, lambda s: not s["dialog"] and queued(s), 60, "cells queued after the dialog")
        break
    state = wait_for(
        page,
        lambda s: s["kernel"] == "idle" and not any("*" in c["prompt"] for c in s["cells"]),
        CELL_TIMEOUT_S,
        "Run All finished",
    )
    last = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell.jp-CodeCell").last
    last.scroll_into_view_if_needed()
    page.wait_for_function(
        """() => { const cells = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell');
                   return cells.length && cells[cells.length - 1].querySelector('.jp-OutputArea-output'); }""",
        timeout=30_000,
    )
    shown = last.locator(".jp-OutputArea").inner_text()
    assert LAST_LINE in shown, f"the last cell shows {shown[-2000:]!r}; the code cells on the page:\n" + "\n---\n".join(
        f"{c['prompt']} {c['output'][-1500:]}" for c in state["cells"]
    )
    return shown


def queued(state: dict) -> bool:
    return any(any(ch in c["prompt"] for ch in "*0123456789") for c in state["cells"])


def answer_dialog(page) -> None:
    """Answers an open dialog as a learner would. Select Kernel is what JupyterLab asks when Run All
    finds the session without a kernel yet: keep the kernel it offers. Any other dialog is unexpected
    and fails the test with its words."""
    state = page.evaluate(PAGE_STATE)
    if not (state and state["dialog"]):
        return
    if not state["dialog"].lstrip().startswith("Select Kernel"):
        raise AssertionError(f"JupyterLab opened a dialog during Run All: {state['dialog']!r}")
    page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()


def saved_errors(page, notebook: Path) -> str:
    """JupyterLab only keeps the cells near the view in the page; saving (Ctrl+S, as a learner would)
    writes every cell's output to the copy's notebook, whose errors then go into the failure message."""
    state = page.evaluate(PAGE_STATE) or {}
    dialog = f"an open dialog said: {state['dialog']!r}\n" if state.get("dialog") else ""
    try:
        page.keyboard.press("Escape")  # closes a dialog that would take the clicks below
        before = notebook.stat().st_mtime_ns
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click(position={"x": 5, "y": 5})
        page.keyboard.press("Escape")
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 15
        while notebook.stat().st_mtime_ns == before and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        errors = [
            f"cell {i}: " + "\n".join(output.traceback)
            for i, cell in enumerate(nbformat.read(notebook, 4).cells)
            for output in cell.get("outputs", [])
            if output.output_type == "error"
        ]
    except Exception as error:  # the message must still say what failed first
        return f"{dialog}(could not save the notebook from the page: {error})"
    return f"{dialog}saved as {notebook}; errors in it:\n" + ("\n".join(errors)[-4000:] if errors else "none")
