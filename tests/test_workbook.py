import pytest

from trl_clinic.cli import main
from trl_clinic.workbook import check_parameters, find_lessons, select

from test_notebooks import NOTEBOOKS


def test_select_by_number_or_name():
    name = next(iter(NOTEBOOKS))
    assert list(select(NOTEBOOKS, [name[:2]])) == [name]
    assert list(select(NOTEBOOKS, [name])) == [name]
    assert select(NOTEBOOKS, []) == NOTEBOOKS


def test_unknown_lesson_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown lesson '99'; known: "):
        select(NOTEBOOKS, ["99"])


def test_unknown_parameter_is_refused():
    with pytest.raises(ValueError, match="has no parameter colour; it takes profile, seed, output_dir"):
        check_parameters(next(iter(NOTEBOOKS.values())), {"profile": "cpu", "colour": "red"})


def test_missing_notebooks_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no notebooks folder"):
        find_lessons(tmp_path / "nowhere")


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["run", "99", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().startswith("trl-clinic: unknown lesson '99'")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--profile", "fast", "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main(["run", "--out", str(tmp_path / "missing" / "o")])
    assert "parent folder" in capsys.readouterr().err
