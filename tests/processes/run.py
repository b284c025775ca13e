"""One process of a launch of several (torchrun, gloo, CPU): a plain transformers Trainer on a tiny Llama, batch 1 x
accumulation 2, 64 rows, one of them with every label masked, so that one process meets a micro-batch without a
label token. ``run.py MODE MASKED [OPTIONS]``: MODE ``watch`` (ClinicWatch), ``stop`` (stop_on="no_labels"),
``checkup`` (the check-up's JSON), ``plain`` (no watch), ``alive`` (train with the watch, then say whether the
trainer and its DDP wrapper outlived the function that built them); OPTIONS a JSON object of TrainingArguments
over the defaults below (``{"use_cpu": false, "ddp_backend": "gloo"}``: the launch that leaves the model unwrapped)
and ``only``: the check-up's probes. Each process prints one ``RESULT {json}`` line. With ``BARE_EXIT=1`` the
script ends as a user's script does (no collection, no ``destroy_process_group``). Run by tests/test_processes.py
and tests/test_watch_processes.py, standalone so it can be launched."""

import json
import os
import sys
import weakref
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments  # noqa: E402

from trl_clinic.course.data import instruction_pairs  # noqa: E402
from trl_clinic.course.models import make_causal_lm  # noqa: E402
from trl_clinic.course.tokenizer import build_tokenizer  # noqa: E402


def trainer(masked: int, out: str, **options) -> Trainer:
    tokenizer = build_tokenizer()
    rows = instruction_pairs(64, seed=0)

    def encode(row, index):
        ids = tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]
        return {"input_ids": ids, "labels": [-100] * len(ids) if index == masked else list(ids)}

    rows = rows.map(encode, with_indices=True, remove_columns=rows.column_names)
    args = TrainingArguments(
        **{
            "output_dir": out,
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 2,
            "num_train_epochs": 1,
            "report_to": "none",
            "save_strategy": "no",
            "logging_steps": 4,
            "disable_tqdm": True,
            "use_cpu": True,  # on a CPU, the processes join over gloo only with use_cpu (accelerate's MULTI_CPU)
            "seed": 0,
            **options,
        }
    )
    return Trainer(
        model=make_causal_lm(tokenizer),
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer),
    )


def alive(masked: int, out: str, options: dict) -> tuple[weakref.ref, weakref.ref, str]:
    """Train with the watch inside a function, as a user's ``main()`` does; weak references to what it built."""
    from trl_clinic.watch import ClinicWatch

    built = trainer(masked, out, **options)
    built.add_callback(ClinicWatch(trainer=built, show=False))
    built.train()
    return weakref.ref(built), weakref.ref(built.model_wrapped), type(built.model_wrapped).__name__


def main() -> None:
    mode, masked = sys.argv[1], int(sys.argv[2])
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    only = options.pop("only", ["labels_present", "gradients_reach"])
    out = os.environ.get("RUN_OUT", "/tmp/trl-clinic-processes")
    if mode == "alive":
        import gc

        gc.disable()  # what outlives the function is what a reference cycle keeps until a collection
        trained, wrapper, kind = alive(masked, out, options)
        index = int(os.environ.get("RANK", 0))
        seen = {"process": index, "wrapper": kind, "trainer_alive": trained() is not None}
        print("RESULT " + json.dumps({**seen, "wrapper_alive": wrapper() is not None}), flush=True)
        gc.enable()
        return
    built = trainer(masked, out, **options)
    index = built.args.process_index
    if mode == "checkup":
        from trl_clinic import checkup

        report = checkup(built, only=only, show=False)
        if report.main:  # the main process writes the one report
            (Path(built.args.output_dir) / f"report-{report.processes}.json").write_text(report.to_json())
        print("RESULT " + json.dumps({"process": index, "exit_code": report.exit_code}), flush=True)
        return
    if mode == "plain":  # no watch: what the same script does without it
        built.train()
        print("RESULT " + json.dumps({"process": index, "step": built.state.global_step, "findings": []}), flush=True)
        return
    from trl_clinic.watch import ClinicWatch

    watch = ClinicWatch(trainer=built, stop_on="no_labels" if mode == "stop" else None)
    built.add_callback(watch)
    built.train()
    seen = [(f.probe, f.step, f.process) for f in watch.findings]
    result = {"process": index, "step": built.state.global_step, "findings": seen}
    result["replicas"] = watch.checks.get("replicas")  # what the replicas check saw
    print("RESULT " + json.dumps(result), flush=True)


def end() -> None:
    """What a careful script does at its end: collect what reference cycles hold, then end the group on every process
    (PyTorch's distributed docs, "Shutdown"). Without it gloo can abort the process at exit, "terminate called without
    an active exception", with no watch in the script (pytorch/pytorch#190489, read 2026-12-02: a plain gloo
    all_gather, no destroy_process_group); a ZeRO-3 launch of sft.py did so once in make test. With ``BARE_EXIT=1``
    the script ends as users write theirs (tests/test_watch_processes.py's exit test)."""
    if os.environ.get("BARE_EXIT"):
        return
    import gc

    import torch.distributed

    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    end()
