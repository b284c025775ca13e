"""Worked solutions to lesson 02b's exercises (gradient accumulation across processes).

Run from the repository root: ``python notebooks/solutions/02b_gradient_accumulation_ddp.py``. Each answer
is measured on the cpu profile (tiny llama, fp32, seed 0, 2 CPU processes over gloo, started by
``trl_clinic.course.child.call`` as the lesson does) with today's real SFTTrainer, printed, and asserted, so the
file fails if an answer stops being true. One launch computes every distributed gradient the answers need.
Rows are dealt to the processes in turn, one batch each (accelerate 1.15, ``data_loader.py``,
``BatchSamplerShard`` with ``split_batches=False``), as the lesson's ``one_step_trainer`` sets them up.
"""

import functools
import tempfile

import torch
from datasets import Dataset
from trl import SFTTrainer

from trl_clinic.course import child, data
from trl_clinic.course.companions.accumulation_ddp import one_step_trainer
from trl_clinic.probes.gradients import first_step_gradient, label_counts, relative_error
from trl_clinic.course.parameters import Run, start_run
from trl_clinic.course.stand_ins import recreate_pre_446_loss

PROCESSES, ACCUMULATION = 2, 2
CASES = {"mixed, batch 1": ("mixed", 1), "biographies, batch 1": ("biographies", 1), "mixed, batch 2": ("mixed", 2)}
SETTINGS = ("old", "per-process", "across-processes")


def samples(kind: str, seed: int) -> Dataset:
    """The lesson's data ("mixed": short and long answers alternate) or one-person biographies only."""
    if kind == "mixed":
        return data.instruction_pairs(64, seed=seed)
    return data.instruction_pairs(128, seed=seed, max_people=1).select(range(1, 128, 2))


def trainer_for(run: Run, kind: str, batch_size: int, accumulation: int, setting: str = "across-processes"
                ) -> SFTTrainer:
    """The lesson's one-step trainer on this case's data; "old" is re-created as in the lesson."""
    trainer = one_step_trainer(run, f"{kind}-{batch_size}x{accumulation}-{setting}", batch_size, accumulation,
                               samples(kind, run.subseed("train")),
                               average_tokens_across_devices=setting == "across-processes")
    return recreate_pre_446_loss(trainer) if setting == "old" else trainer


def distributed(run: Run, spec: dict) -> dict:
    """Runs in every process: the synchronised first-step gradient of each case and setting, and the
    label tokens each process saw (gathered, in rank order)."""
    from accelerate.utils import gather_object

    out = {}
    for case, (kind, batch_size) in CASES.items():
        for setting in SETTINGS:
            trainer = trainer_for(run, kind, batch_size, ACCUMULATION, setting)
            out[(case, setting)] = first_step_gradient(trainer)
        out[(case, "counts")] = gather_object([sum(label_counts(trainer, ACCUMULATION))])
    return out


@functools.cache
def errors() -> dict:
    """Each case's relative error per setting against one process with the whole batch, and the counts."""
    run = start_run("02b", "cpu", 0, tempfile.mkdtemp(prefix="solutions-02b-"))
    launched = child.call(run, f"{__file__}:distributed", name="solutions", processes=PROCESSES, timeout=300)
    assert not launched.outcome.crashed, launched.outcome.stderr[-3000:]
    table = {}
    for case, (kind, batch_size) in CASES.items():
        reference = first_step_gradient(trainer_for(run, kind, PROCESSES * batch_size * ACCUMULATION, 1))
        table[case] = {s: relative_error(launched.result[(case, s)], reference) for s in SETTINGS}
        table[case]["counts"] = launched.result[(case, "counts")]
    return table


def exercise_1() -> None:
    """Make every sample about the same length (max_people=1, biographies only): which settings match now?"""
    even, mixed = errors()["biographies, batch 1"], errors()["mixed, batch 1"]
    print(f"1. all three: the processes' label tokens are equal ({even['counts']}), so every mean weighs tokens "
          f"alike: old {even['old']:.1e}, per-process {even['per-process']:.1e}, across-processes "
          f"{even['across-processes']:.1e}, against {mixed['old']:.2f} and {mixed['per-process']:.2f} on mixed data.")
    assert len(set(even["counts"])) == 1 and max(even[s] for s in SETTINGS) < 1e-4 < mixed["per-process"]


def exercise_2() -> None:
    """With 2 processes and per_device_train_batch_size=2, predict the per-process error, then measure."""
    two, one = errors()["mixed, batch 2"], errors()["mixed, batch 1"]
    print(f"2. at batch 1 the sampler deals rows alternately, so process 0 holds only short answers and process 1 "
          f"only long ones; at batch 2 each process gets a short and a long answer per micro-batch, their label "
          f"tokens come closer ({two['counts']}), and the per-process error drops from {one['per-process']:.2f} to "
          f"{two['per-process']:.2f}, not to zero; across-processes still matches ({two['across-processes']:.1e}).")
    assert 1e-3 < two["per-process"] < 0.2 * one["per-process"] and two["across-processes"] < 1e-4
    assert len(set(two["counts"])) > 1


if __name__ == "__main__":
    torch.set_num_threads(1)
    exercise_1()
    exercise_2()
