"""The lesson table (each folder's lesson.yaml, and profiles.yaml): complete, consistent, and sized for what each
lesson's checks assume.

The gpu profile has rarely run on a GPU, so what its sizes must satisfy is checked here, on any machine.
"""

import pytest

from trl_clinic.course import lessons
from trl_clinic.course.lessons import CONCRETE_PROFILES, describe_shape, find_lesson, profile_settings
from trl_clinic.course.models import MODEL_SIZES, PRETRAINED_SIZES

TABLE = lessons.lessons()
SHAPES = [(key, profile) for key in TABLE for profile in CONCRETE_PROFILES]


def test_every_notebook_has_a_lesson_entry_and_back(notebooks):
    """Each deep dive comes after its core; the runner lists the cores first, then the deep dives."""
    assert sorted(lesson.stem for lesson in TABLE.values()) == sorted(notebooks)
    cores = [lesson.stem for lesson in TABLE.values() if lesson.is_core]
    assert list(notebooks)[: len(cores)] == cores


def test_profiles_declare_device_precision_and_attention():
    cpu, gpu = profile_settings("cpu"), profile_settings("gpu")
    assert (cpu.device, cpu.precision, cpu.attention) == ("cpu", "fp32", "sdpa")
    assert (gpu.device, gpu.precision) == ("cuda", "bf16")


@pytest.mark.parametrize("key, profile", SHAPES)
def test_every_shape_names_its_model_and_is_listed(key, profile):
    sizes = TABLE[key].sizes(profile)
    assert sizes.model and sizes.model_size in (*MODEL_SIZES, *PRETRAINED_SIZES)
    assert f"model: {sizes.model}" in describe_shape(TABLE[key], profile)


def test_a_misspelt_size_is_an_error_naming_the_known_ones():
    with pytest.raises(AttributeError, match="no size 'grpo_step'.*grpo_steps"):
        _ = find_lesson("05-deeper").sizes("cpu").grpo_step


def test_a_size_declared_for_one_profile_only_is_refused():
    table = lessons._read()
    table["lessons"]["02"]["gpu"]["extra_steps"] = 3
    with pytest.raises(ValueError, match="lesson 02 declares different sizes per profile"):
        lessons._check(table)


# What each lesson's checks assume of its sizes, on every profile.
@pytest.mark.parametrize("profile", CONCRETE_PROFILES)
def test_sizes_fit_what_the_checks_assume(profile):
    s01, s01d = TABLE["01"].sizes(profile), TABLE["01-deeper"].sizes(profile)
    assert s01.batch_sizes[0] == 1 and s01.batch_sizes == sorted(s01.batch_sizes) and len(s01.batch_sizes) >= 3
    assert s01.samples % s01.batch_sizes[-1] == 0 and s01.samples >= 4 * s01.batch_sizes[-1]  # whole batches
    assert s01.mask_lengths == [3, 2, 3]  # exercise 1's answer (21 cells) and a mask small enough to check by hand
    assert s01d.batch_sizes == sorted(s01d.batch_sizes) and s01d.batch_sizes[0] > 1 and len(s01d.batch_sizes) >= 2
    assert s01d.measure_samples % s01d.batch_sizes[-1] == 0 and s01d.samples % s01d.batch_sizes[-1] == 0
    assert s01d.warmup_learning_rate <= 3e-3 and s01d.train_steps > 5  # a final loss over the last five steps
    assert s01d.speed_steps > s01d.speed_warm_steps >= 1 and s01d.model_size == s01.model_size
    s02, s02d = TABLE["02"].sizes(profile), TABLE["02-deeper"].sizes(profile)
    for sweep in (s02.accumulation_sweep, s02d.accumulation_sweep):
        assert min(sweep) >= 2 and sweep == sorted(set(sweep))
    assert s02.accumulation == 32 and s02.accumulation in s02.accumulation_sweep  # the report's batch 1 x 32 against 32
    assert s02.n_train >= max(s02.accumulation_sweep)  # the largest count's window, rows read in order
    assert s02d.curve_accumulation in s02d.accumulation_sweep and s02d.curve_steps >= 4
    assert s02d.n_train >= s02d.curve_steps * s02d.curve_accumulation  # one pass, no sample repeated
    assert s02d.curve_accumulation == 32 and s02d.packing_length >= 64  # the report's batch 1 x 32 against 32
    s02b = TABLE["02b"].sizes(profile)
    assert s02b.processes == 2 and s02b.accumulation[0] == 1 and len(s02b.accumulation) >= 3
    assert s02b.n_samples >= s02b.processes * 2 * max(s02b.accumulation)  # exercise 2: batch 2 per process
    s03 = TABLE["03"].sizes(profile)
    assert (
        s03.train_steps >= 50 and s03.train_steps % 25 == 0 and s03.eval_pairs >= 64
    )  # logs at 25 and 50: 1e34, then 0
    s03d = TABLE["03-deeper"].sizes(profile)
    assert s03d.train_steps == 25 and 32 in s03d.accumulation_sweep and len(s03d.accumulation_sweep) >= 2  # 13**32 / 25
    assert s03d.accumulation_sweep == sorted(set(s03d.accumulation_sweep))
    assert max(s03d.fused_steps, s03d.head_steps) <= s03d.train_steps  # the pairs drawn: train_steps x batch x 32
    s04 = TABLE["04"].sizes(profile)
    # at least 3 chat questions: the third (the longest of the list) is the one row without a pad, the others padded
    assert s04.dpo_steps >= 1 and 3 <= s04.chat_prompts <= 6 and s04.dpo_eval_pairs >= 8
    s04d = TABLE["04-deeper"].sizes(profile)
    assert s04d.dpo_steps >= 1 and s04d.n_prompts >= 4 and s04d.sft_eval_rows % 2 == 0  # whole batches of 2
    s05 = TABLE["05"].sizes(profile)
    assert s05.user_steps >= 2 and s05.generations >= 2 and s05.child_timeout_s >= 60
    s05d = TABLE["05-deeper"].sizes(profile)  # reward_ends reads a tenth of the run at each end
    assert s05d.grpo_steps >= 20 and s05d.suspect_steps >= 10 and s05d.generations >= 2 and s05d.prompts_per_step >= 1


def test_lesson_05_trains_smollm2_as_the_policy_on_the_gpu_profile():
    """Real SmolLM2-135M-Instruct weights as the GRPO policy on the gpu profile, a tiny one on the cpu."""
    for key in ("05", "05-deeper"):
        assert TABLE[key].sizes("gpu").model_size == "smollm2" and TABLE[key].sizes("cpu").model_size in MODEL_SIZES


def test_lesson_02_trains_the_reports_pretrained_model_on_the_gpu_profile():
    """The report ran SmolLM-135M: the deep dive's gpu profile (its Llama runs: the era, the sweeps, whole runs) uses
    real SmolLM2-135M-Instruct weights. The core shows the bug on today's code path, which needs a class that declares
    no loss kwargs (a Qwen2.5-VL from its config): no pretrained weights of it ship offline."""
    assert TABLE["02-deeper"].sizes("gpu").model_size == "smollm2"
    assert "SmolLM2-135M" in TABLE["02-deeper"].sizes("gpu").model
    for key in ("02", "02-deeper"):
        assert TABLE[key].sizes("cpu").model_size in MODEL_SIZES
