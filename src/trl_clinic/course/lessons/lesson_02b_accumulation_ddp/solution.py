# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02b · Worked solutions
#
# The exercises of [02b_gradient_accumulation_ddp.ipynb](../02b_gradient_accumulation_ddp.ipynb), at the lesson's
# own sizes: the launch of section 1 with another `spec`, compared with one process holding the whole batch.
# The lesson's own spec (batch 1, mixed rows) is not launched again: its per-process error comes from section 2's
# objective computed by hand in this process, which the lesson measured equal to the launch's gradient.

# %% tags=["parameters"]
profile = "auto"  # "auto" (gpu when CUDA is present), "cpu" or "gpu"
seed = 0
output_dir = None  # None: outputs/02b_gradient_accumulation_ddp at the repository root

# %%
from trl_clinic.course import child
from trl_clinic.course.lessons.lesson_02b_accumulation_ddp import companion
from trl_clinic.course.parameters import start_run
from trl_clinic.probes.gradients import relative_error

run = start_run("02b", profile, seed, output_dir)
sizes = run.sizes
TARGET = "trl_clinic.course.lessons.lesson_02b_accumulation_ddp.companion:distributed_gradients"
SETTINGS = {"per-process": {"average_tokens_across_devices": False},
            "across processes": {"average_tokens_across_devices": True}}
k = max(sizes.accumulation)


def launch(spec: dict, name: str) -> tuple[dict[str, list[float]], list[int]]:
    """The lesson's launch with ``spec``: each setting's relative errors against one process, and the label
    tokens of each process's window at the largest accumulation."""
    launched = child.call(run, TARGET, spec, name=name, processes=sizes.processes, timeout=sizes.child_timeout_s)
    assert not launched.outcome.crashed, launched.outcome.stderr[-3000:]
    comparison = companion.compare(launched.result["gradients"], companion.reference_gradients(run, spec), SETTINGS)
    errors = {setting: [row["relative_error"] for row in rows] for setting, rows in comparison.items()}
    return errors, [sum(per_rank) for per_rank in launched.result["counts"][k]]


spec = {"settings": SETTINGS, "rows": "mixed", "batch_size": 1}
lesson = {"per-process": [relative_error(companion.per_process_gradient(run, spec, accumulation), reference.gradient)
                          for accumulation, reference in companion.reference_gradients(run, spec).items()]}
lesson_tokens = companion.per_process_weights(run, spec, k)[1]

# %% [markdown]
# ## Exercise 1
#
# One-person biographies only.

# %%
equal, equal_tokens = launch({"settings": SETTINGS, "rows": "biographies", "batch_size": 1}, "solutions-1")
print(f"both settings match now: the processes hold {equal_tokens} label tokens, so 1/(W N_p) = 1/sum(N) for every "
      f"token; largest error per-process {max(equal['per-process']):.1e}, across processes "
      f"{max(equal['across processes']):.1e} (mixed rows: per-process up to {max(lesson['per-process']):.2f}).")
assert len(set(equal_tokens)) == 1 and max(max(errors) for errors in equal.values()) < 1e-4

# %% [markdown]
# ## Exercise 2
#
# Batch 2 per process.

# %%
two, two_tokens = launch({"settings": SETTINGS, "rows": "mixed", "batch_size": 2}, "solutions-2")
print(f"with batch 1 the processes held {lesson_tokens} label tokens (every one-word answer on one, every biography "
      f"on the other); with batch 2 each micro-batch holds one of each, {two_tokens}: closer, not equal. The "
      f"per-process error drops from {max(lesson['per-process']):.2f} to {max(two['per-process']):.2f}; across "
      f"processes still matches ({max(two['across processes']):.1e}).")
assert 1e-3 < max(two["per-process"]) < 0.5 * max(lesson["per-process"]) and max(two["across processes"]) < 1e-4
assert len(set(two_tokens)) > 1
