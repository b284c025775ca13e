import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from trl_clinic.cli import main
from trl_clinic.course.eras import era_names
from trl_clinic.course.report import build_report
from trl_clinic.course.workbook import check_parameters, find_lessons, longest_first, select


def test_select_by_number_or_name(notebooks):
    """A lesson's number picks its core and its deep dive; --cores leaves the deep dives out (a workshop's run)."""
    name = next(iter(notebooks))
    both = [n for n in notebooks if n.split("_", 1)[0] == name[:2]]
    assert list(select(notebooks, [name[:2]])) == both and len(both) == 2 and both[0] == name
    assert list(select(notebooks, [name])) == [name]
    assert list(select(notebooks, [name[:2]], cores_only=True)) == [name]
    assert all(path.parent.name != "deeper" for path in select(notebooks, [], cores_only=True).values())
    assert select(notebooks, []) == notebooks


def test_unknown_lesson_lists_the_known_ones(notebooks):
    with pytest.raises(ValueError, match="unknown lesson '99'; known: "):
        select(notebooks, ["99"])


def test_unknown_parameter_is_refused(notebooks):
    with pytest.raises(ValueError, match="has no parameter colour; it takes profile, seed, output_dir"):
        check_parameters(next(iter(notebooks.values())), {"profile": "cpu", "colour": "red"})


def test_missing_notebooks_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no notebooks folder"):
        find_lessons(tmp_path / "nowhere")


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["run", "99", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().startswith("trl-clinic: unknown lesson '99'")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--profile", "fast", "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    capsys.readouterr()


@pytest.mark.parametrize(
    "out, words",
    [
        ("{tmp}/missing/o", "parent folder"),
        ("/proc/nope", "cannot write to"),
        ("{tmp}/a-file", "is a file, not a folder"),
    ],
)
def test_an_output_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys, out, words):
    (tmp_path / "a-file").write_text("")
    assert main(["run", "02", "--out", out.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("trl-clinic: ") and words in err, err


def test_list_and_help_answer_without_importing_papermill_or_torch():
    code = (
        "import sys, contextlib, io\nfrom trl_clinic.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['list'])\n"
        "print(sorted(m for m in ('torch', 'papermill', 'nbformat', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# a lesson that passes its one check: the smallest real run of the runner
FINE_LESSON = "\n".join(
    [
        "from trl_clinic.course.parameters import start_run",
        "from trl_clinic.course.results import measured, save_metrics",
        "run = start_run('02', profile, seed, output_dir)",
        "save_metrics(run, '02', {'x': 1.0}, lambda n: ({'shown': measured(n['x'] > 0)}, {'fixed': measured(True)}))",
    ]
)


def tiny_notebook(path, body):
    cells = [
        nbformat.v4.new_code_cell('profile = "cpu"\nseed = 0\noutput_dir = "out"'),
        nbformat.v4.new_code_cell(body),
    ]
    cells[0].metadata["tags"] = ["parameters"]
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def test_a_failing_lesson_does_not_stop_the_others(tmp_path, capsys):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    tiny_notebook(lessons / "01_broken.ipynb", "raise RuntimeError('this lesson is broken')")
    tiny_notebook(lessons / "02_fine.ipynb", FINE_LESSON)
    out = tmp_path / "out"
    assert main(["run", "--profile", "cpu", "--out", str(out), "--no-progress", "--notebooks", str(lessons)]) == 1
    printed = capsys.readouterr().out
    assert "01_broken: error" in printed and "RuntimeError: this lesson is broken" in printed
    assert "02_fine: passed" in printed
    assert "RuntimeError" in (out / "01_broken" / "01_broken.ipynb").read_text()  # executed copy kept
    summary = json.loads((out / "summary.json").read_text())
    assert [row["status"] for row in summary["lessons"]] == ["error", "passed"]
    report = build_report(out).read_text()
    assert "01_broken" in report and "02_fine" in report


def test_list_shows_parameters_and_every_profile_shape(notebooks, capsys):
    assert main(["list", "--notebooks", str(next(iter(notebooks.values())).parent)]) == 0
    text = capsys.readouterr().out
    assert 'profile="auto"' in text and "output_dir=None" in text
    for name in notebooks:
        assert f"{name}: " in text
    assert text.count("  cpu: cpu, fp32, sdpa") == len(notebooks)
    assert text.count("  gpu: cuda, bf16") == len(notebooks)
    assert "grpo_steps=150" in text and "child_timeout_s=600" in text


def test_the_runner_starts_without_torch():
    code = (
        "import sys, trl_clinic.cli, trl_clinic.course.workbook, trl_clinic.course.lessons; "
        "print('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_report_needs_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no executed lessons" in capsys.readouterr().err


ERAS = era_names()
ROOT = Path(__file__).resolve().parents[1]


def test_doctor_reports_versions_device_and_traps(capsys):
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    for needle in (
        "trl:",
        "bf16 supported",
        "sdpa: built model uses sdpa",
        "flash_attention_2",
        "flash_attention_4",
        "the cpu profile uses: sdpa",
        "warnings:",
        "workshop readiness:",
    ):
        assert needle in text
    for era in ERAS:  # a facilitator sees, per era, ready or the command that builds it
        assert f"era {era}: " in text


def test_report_shows_the_lessons_sentence_and_says_when_the_real_old_code_ran(tmp_path):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    era = {
        "era": "02-transformers-4.45",
        "script": "then_02.py",
        "status": "finished",
        "message": "",
        "versions": {"transformers": "4.45.2"},
    }
    tiny_notebook(
        lessons / "02_fine.ipynb",
        "\n".join(
            [
                "from trl_clinic.course.parameters import start_run",
                "from trl_clinic.course.results import measured, recreated, save_metrics",
                "run = start_run('02', profile, seed, output_dir)",
                "save_metrics(run, '02', {'error': 0.5},",
                "             lambda n: ({'bad': recreated(n['error'] > 0.1)}, {'fixed': measured(True)}),",
                f"             eras=[{era!r}], summary=f'The old path missed the big batch by 0.5.')",
            ]
        ),
    )
    out = tmp_path / "out"
    assert main(["run", "--profile", "cpu", "--out", str(out), "--no-progress", "--notebooks", str(lessons)]) == 0
    report = build_report(out).read_text()
    assert "The old path missed the big batch by 0.5." in report and "<code>error</code>" not in report
    assert "yes (recreated); also run on the real old code" in report
    assert "The old path missed the big batch by 0.5." in (out / "summary.md").read_text()


def test_lessons_run_several_at_once_keep_their_order_and_the_report_says_so(tmp_path, capsys):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    for name in ("01_slow", "02_fast"):  # 01 ends a few seconds after 02 started, however loaded the machine
        tiny_notebook(
            lessons / f"{name}.ipynb",
            "\n".join(
                [
                    "import time, os",
                    "fast = os.path.join(output_dir, '..', '02_fast', 'pid')",
                    "while {slow} and not os.path.exists(fast): time.sleep(0.2)".format(slow=name == "01_slow"),
                    f"time.sleep({3 if name == '01_slow' else 0})",
                    "open(os.path.join(output_dir, 'pid'), 'w').write(str(os.getppid()))",
                ]
            ),
        )
    out = tmp_path / "out"
    assert (
        main(
            ["run", "--profile", "cpu", "--out", str(out), "--no-progress", "--notebooks", str(lessons), "--jobs", "2"]
        )
        == 1
    )  # no metrics.json: both end as errors, which is beside the point here
    printed = capsys.readouterr().out
    assert "(2 at once, one process each)" in printed
    assert printed.index("02_fast:") < printed.index("01_slow:")  # said as each ends
    summary = json.loads((out / "summary.json").read_text())
    assert [row["lesson"] for row in summary["lessons"]] == ["01_slow", "02_fast"]  # kept in order
    assert summary["parameters"]["jobs"] == 2
    assert (out / "01_slow" / "pid").read_text() != (out / "02_fast" / "pid").read_text()  # one runner each
    assert "2 lessons ran at once" in build_report(out).read_text()


def test_several_at_once_start_the_longest_lessons_first(notebooks):
    from trl_clinic.course.lessons import lessons

    cpu = {lesson.stem: lesson.seconds["cpu"] for lesson in lessons().values()}
    started = longest_first(list(notebooks.values()) + [Path("99_unmeasured.ipynb")], "auto")
    assert [cpu.get(path.stem, 0) for path in started] == sorted(cpu.values(), reverse=True) + [0]
    assert started[0].stem == max(cpu, key=cpu.get) and started[-1].stem == "99_unmeasured"


def test_jobs_must_be_positive(tmp_path, capsys):
    assert main(["run", "02", "--out", str(tmp_path / "o"), "--jobs", "-1"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
