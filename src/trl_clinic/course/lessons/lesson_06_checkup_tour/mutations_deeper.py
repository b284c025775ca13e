"""Lesson 06, deeper: the command line, the label traps, a model that takes no loss keywords, the families, the table.
The lesson records both runs side by side (``numbers["runs"]``): ``without_fix`` (the OPT padding-free recipe, the
GRPO recipe of 3 completions in groups of 4, labels cut by truncation, pad == eos, the model class without
``**kwargs``, OPT packed, lesson 04's report's versions) and ``with_fix`` (padding_free: false, 4 completions, a
max_length past the prompts, a pad token of its own, a forward with ``**kwargs``, Llama and Qwen2 packed, the
installed versions), each with the same measurements. ``today`` holds what both share: today's peft and TRL, where
two old traps (LoRA with reentrant checkpointing; DPO's cache) are measured clean; no run of this lesson has the old
code, so those two checks are SHARED, each with a one-field mutation to the number the old code gave.

Margins (spread over seeds 0-5, one thread, cpu profile, in ``SPREAD``):
- "gradient error above / below its 1e-3 tolerance" (the accumulation probe's own fp32 line): the model that takes no
  loss keywords reweights micro-batches of unequal label counts, an error of the order of their spread (0.20 to
  0.24 at seeds 0-5); the model with ``**kwargs`` differs by fp32 rounding (1.2e-7 to 1.4e-7). The line is argued
  10x from its own side: a label-count spread ten times smaller than the data's, or a rounding ten thousand times
  worse than fp32's, is what would cross it. From the other side each is argued within tenfold of where it sits
  (so a line loosened tenfold fails): 1e3x over the rounding (7100x to 8300x at seeds 0-5; the fixture's 2.6e-7,
  3.9e3x) and 100x under the reweighting (197x to 242x; the fixture's 0.64, 640x).

The gpu profile runs the same tiny trainers, recipes and sizes on a GPU (the command line's recipes keep ``use_cpu``
only on the cpu profile); the models stay fp32 there (``examples.config_kwargs`` sets bf16=False), so the two
gradient errors keep their cpu values: ``gpu_shape`` checks that the sizes are the cpu profile's.
"""

from trl_clinic.course.mutations import log, other_run

# seeds 0-5, one thread, cpu profile (min, max over the six runs)
SPREAD = {
    "gradient error, the model without **kwargs": (0.20, 0.24),  # 197x to 242x above 1e-3
    "gradient error, the model with **kwargs": (1.2e-7, 1.4e-7),  # 7100x to 8300x below 1e-3
}


OTHER_RUN = other_run("without_fix", "with_fix")

SHARED = {
    "in either order, gets every gradient": "today's peft makes the input embeddings need a gradient whichever comes "
    "first (_prepare_model_for_gradient_checkpointing); both runs have today's peft, no run has the old trap",
    "TRL's DPO builds no cache": "today's TRL DPOTrainer passes use_cache=False; both runs have today's TRL, lesson 04 "
    "runs the old one",
}

MUTATIONS = {
    # input embeddings without requires_grad (disable_input_require_grads after peft: 8 of 8 without a gradient)
    "in either order, gets every gradient": lambda n: n["today"]["gradients"][
        "gradients, LoRA, then checkpointing"
    ].update(status="fail", value=8),
    # TRL 0.17's DPO, which kept the cache (lesson 04's era; docs/checkup.md: 4 cached right-padded forwards)
    "TRL's DPO builds no cache": lambda n: n["today"]["dpo"].update(value=4),
}

MARGINS = {
    "gradient error above its 1e-3 tolerance": log(10, 1e3),
    "gradient error below its 1e-3 tolerance": log(10, 100),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The gpu profile has the cpu profile's sizes (rows, batches, accumulation): the same shape."""
    assert {k: sizes[k] for k in ("rows", "batch_size", "accumulation", "packed_batch_size")} == {
        "rows": 16,
        "batch_size": 2,
        "accumulation": 4,
        "packed_batch_size": 4,
    }
    return numbers
