"""Every deep dive passes its own checks on the cpu profile, run once through the real runner.

A file of its own so that pytest-xdist (`--dist loadfile`) runs the deep dives on one worker while the cores
(tests/test_notebooks.py) run on the other: together they are most of make test's minutes.
"""

import pytest
from test_eras import attention_across, era_result, reported_in
from test_notebooks import NOTEBOOKS, assert_passed, run_workbook

from trl_clinic.course.lessons import lessons
from trl_clinic.course.workbook import is_deep_dive

DEEP_DIVES = {name: path for name, path in NOTEBOOKS.items() if is_deep_dive(path)}


@pytest.fixture(scope="session")
def deep_dives(tmp_path_factory):
    return run_workbook(tmp_path_factory.mktemp("deep-dives"), *DEEP_DIVES)


@pytest.mark.notebook
@pytest.mark.parametrize("name", DEEP_DIVES)
def test_cpu_profile_passes_its_checks(deep_dives, name):
    assert_passed(deep_dives[0], deep_dives[2], name)


@pytest.mark.notebook
def test_the_runner_exits_zero_when_every_deep_dive_passed(deep_dives):
    assert deep_dives[1] == 0


@pytest.mark.era
def test_01_the_deep_dive_s_padding_free_run_on_transformers_4_55(deep_dives):
    """trl 0.21 as SFTTrainer builds it on sdpa: a mask of ones and no position_ids; transformers 4.55 isolates the
    packed sequences only without the cache (use_cache=True turns the block mask off), and the loss still grows."""
    later = era_result(deep_dives[0] / "01_padding_free_high_loss_deeper" / "then", "then_01", "01-transformers-4.55")
    assert later["collator"]["attention_mask_all_ones"] and not later["collator"]["has_position_ids"]
    for implementation in ("eager", "sdpa"):
        isolated = later["isolated"][implementation]
        assert isolated["train, use_cache=False, no mask"] and isolated["eval, use_cache=False, no mask"]
        assert not isolated["train, config use_cache=True, no mask"]  # the cache turns the block mask off
        assert not isolated["train, the collator's batch as its trainer sends it"]
    assert attention_across(later, "eval, use_cache=False, no mask") == 0  # block-diagonal
    assert attention_across(later, "train, config use_cache=True, no mask") == 21
    assert later["loss_by_batch_size"]["ratio"][-1] > 2  # trl 0.21 on sdpa: the mask of ones
    assert any("flash_attention_2" in w for w in later["loss_by_batch_size"]["warnings"])  # and it warned


@pytest.mark.era
def test_05_the_report_s_grpo_config_is_accepted_and_trains_on_trl_0_14(deep_dives):
    """The deep dive's TRL 0.14.0 run of the report's GRPOConfig as written, which is the core's."""
    result = era_result(deep_dives[0] / "05_grpo_sigfpe_deeper" / "then", "then_05", "01-trl-0.14")
    assert result["era_versions"]["trl"] == "0.14.0"
    assert result["reported"] == reported_in(lessons()["05"].source)
    assert result["config_accepted_as_written"] is True and result["error"] is None
    assert result["config_as_read"]["num_generations"] == 16
    assert result["optimizer_steps"] == 1
    # 0.14.0 counts prompts: per-device batch 1 scores one prompt's 16 completions a micro-batch
    assert result["batch_help"].startswith("Number of prompts sampled per device")
    assert set(result["completions_per_call"]) == {16}
    assert result["default_bf16"] is False  # the documentation's example, not naming bf16, ran in fp32
