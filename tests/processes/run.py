"""One process of a launch of several (torchrun, gloo, CPU): a plain transformers Trainer on a tiny Llama, batch 1 x
accumulation 2, 64 rows, one of them with every label masked, so that one process meets a micro-batch without a
label token. ``run.py MODE MASKED [PROCESSES]``: MODE ``watch`` (ClinicWatch), ``stop`` (stop_on="no_labels"),
``checkup`` (the check-up's JSON); each process prints one ``RESULT {json}`` line. Run by tests/test_processes.py,
standalone so it can be launched."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments  # noqa: E402

from trl_clinic.course.data import instruction_pairs  # noqa: E402
from trl_clinic.course.models import make_causal_lm  # noqa: E402
from trl_clinic.course.tokenizer import build_tokenizer  # noqa: E402


def trainer(masked: int, out: str) -> Trainer:
    tokenizer = build_tokenizer()
    rows = instruction_pairs(64, seed=0)

    def encode(row, index):
        ids = tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]
        return {"input_ids": ids, "labels": [-100] * len(ids) if index == masked else list(ids)}

    rows = rows.map(encode, with_indices=True, remove_columns=rows.column_names)
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        report_to="none",
        save_strategy="no",
        logging_steps=4,
        disable_tqdm=True,
        use_cpu=True,  # on a CPU, the processes join over gloo only with use_cpu (accelerate's MULTI_CPU)
        seed=0,
    )
    return Trainer(
        model=make_causal_lm(tokenizer),
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer),
    )


def main() -> None:
    mode, masked = sys.argv[1], int(sys.argv[2])
    built = trainer(masked, os.environ.get("RUN_OUT", "/tmp/trl-clinic-processes"))
    index = built.args.process_index
    if mode == "checkup":
        from trl_clinic import checkup

        report = checkup(built, only=["labels_present", "gradients_reach"], show=False)
        if report.main:  # the main process writes the one report
            (Path(built.args.output_dir) / f"report-{report.processes}.json").write_text(report.to_json())
        print("RESULT " + json.dumps({"process": index, "exit_code": report.exit_code}), flush=True)
        return
    from trl_clinic.watch import ClinicWatch

    watch = ClinicWatch(trainer=built, stop_on="no_labels" if mode == "stop" else None)
    built.add_callback(watch)
    built.train()
    seen = [(f.probe, f.step, f.process) for f in watch.findings]
    print("RESULT " + json.dumps({"process": index, "step": built.state.global_step, "findings": seen}), flush=True)


if __name__ == "__main__":
    main()
    import gc

    import torch.distributed

    # the trainer's DDP wrapper holds the process group; the trainer and its callbacks refer to each other, so it
    # outlives main() until a collection at the interpreter's exit, where destroying gloo's threads aborts it
    # ("terminate called without an active exception"): collect it now, then end the group on every process
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
