"""Lesson 01, deep dive: how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile: a small OPT (about 30M parameters, warmed up 300 steps at batch 16) through today's
SFTTrainer in bf16 autocast at batch sizes 4, 16 and 64 over 256 samples with passages of up to 80 sentences (more
work per step, not more steps); the short trainings 60 steps at batch 16; SmolLM2-135M-Instruct (real weights) on
the fixed path with the best FlashAttention installed; the side environment (TRL 0.21.0) on CPU as on the cpu
profile. Each threshold, argued for those sizes:
- "over 1.05x at batch N in every setting", "over 1.5x where it hurts most", "grows with the batch size", "grad norm
  over 1.5x ... loss on every token": at seeds 0-5 on the cpu profile the smallest last ratio was 1.11 (completion-only
  MRC, seed 2), the worst setting's 1.99 to 2.09, the whole-sequence grad norms 4.7x to 21x (completion-only MRC's
  one-word answers give a noisy grad norm, 0.84x to 3.6x: not checked).
  The gpu's largest batch packs four times more sequences into a row, and its passages are longer: a token reads
  more foreign keys, never fewer; its larger model is warmed up longer on the same data, so it leans on the context
  at least as much. bf16 rounding moves a mean loss by about 1e-2 relative, far under the 0.1 and 0.5 margins.
- "grad norm at step 1 (same weights) is over 2x padded": 14x at seed 0 on the cpu profile; a property of the
  warmed-up weights and the first batch, kept by a model that uses context more.
- "logs a higher loss to the end": over 60 steps instead of 12 the padding-free run keeps paying for its neighbours
  (the held-out packed/alone ratio fell from 1.9 to 1.06 in 12 steps at seed 0, not to 1).
- "remedies short of attention leave the loss over 1.05x padded": at seeds 0-5 the data-side ones (learning rate 0,
  same weights) left 1.70x to 2.2x, the optimizer-side ones (mean logged loss against the padded training) 1.17x to
  1.58x; a cure gives 1 to float precision (the Llama's fixed path: 1e-7 in fp32, within 5e-2 in bf16). The
  optimizer-side margin is the thinnest: 60 steps instead of 12 let the model learn to discount its neighbours
  further (its held-out packed/alone ratio fell from about 2 to 1.03-1.07 in 12 steps), so the gpu run is where
  this margin is least certain.
- "Llama on today's padding-free path follows padded step by step": 1e-3 in fp32 (measured: 1e-6 after 20 steps);
  5e-2 in bf16 (SmolLM2 at learning rate 1e-5 for 60 steps: padded and varlen FlashAttention sum in other orders,
  about 1e-2 of relative loss per step in bf16, and the runs drift apart slowly at that learning rate).
- the probes, "model_init_kwargs", the side environment's checks: probes run on tiny fp32 models on every profile,
  the rest are names, flags and CPU measurements: the same at any size.
"""

from mutation_helpers import cycled

MUTATIONS = {
    # a transformers whose mask builder kept the boundaries beside a given mask (none does today)
    "sent with a mask of ones": lambda n: n["probes"]["+ an attention mask of ones"].update(isolated=True),
    # a run that built no cache (use_cache=False, as SFTTrainer passes it)
    "run with use_cache=True": lambda n: n["probes"]["+ use_cache=True"].update(isolated=True),
    # a Bloom whose mask builder were given position_ids, as Llama's is
    "probe flags OPT, Falcon, Bloom and MPT": lambda n: n["families"]["bloom"].update(isolated=True),
    # a setting whose ratio saturated before the largest batch
    "grows with the batch size in every setting": lambda n: n["loss_ratio"].update(
        {"MRC, completion-only": n["loss_ratio"]["MRC, completion-only"][::-1]}
    ),
    # a setting the contamination barely moves (MRC, whole sequence after a completion-only warm-up: 1.01, 1.01)
    "over 1.05x at batch": lambda n: n["loss_ratio"].update(
        {"MRC, whole sequence": [1.005] + [1.01] * (len(n["loss_ratio"]["MRC, whole sequence"]) - 1)}
    ),
    # a model that leans on the context less: every setting's ratio under 1.5, still growing
    "where it hurts most": lambda n: n["loss_ratio"].update(
        {name: [1.2] + [1.3] * (len(r) - 1) for name, r in n["loss_ratio"].items()}
    ),
    # the grad norm of a setting the contamination barely moves (measured 1.0, 1.0 in that run)
    "grad norm over 1.5x padded": lambda n: n["grad_ratio"].update(
        {"MRC, whole sequence": [1.0] * len(n["grad_ratio"]["MRC, whole sequence"])}
    ),
    # transformers <= 4.53.0: no boundary search on sdpa
    "probe finds Llama isolated with position_ids": lambda n: n["probes"]["position_ids, no mask, no cache"].update(
        isolated=False
    ),
    # a Qwen2 whose mask builder were not given position_ids
    "Llama and Qwen2 isolated across families": lambda n: n["families"]["qwen2"].update(isolated=False),
    # a run without the bug: the padding-free first step as padded (a kernel that reads boundaries)
    "grad norm at step 1": lambda n: n["training"]["OPT, padding-free"]["grad_norm"].__setitem__(
        0, n["training"]["OPT, padded"]["grad_norm"][0]
    ),
    # a run without the bug: its last steps' loss as padded
    "logs a higher loss to the end": lambda n: n["training"]["OPT, padding-free"].update(
        final_loss=n["training"]["OPT, padded"]["final_loss"]
    ),
    # a remedy that cured it (what padding_free=False gives): the loss of the padded run
    "remedies short of attention": lambda n: n["remedies"][next(iter(n["remedies"]))].update(over_padded=1.0),
    # a smaller batch that logged no lower loss
    "a smaller batch hides": lambda n: [
        r.update(loss=r["baseline"] + 0.1) for name, r in n["remedies"].items() if name.startswith("smaller")
    ],
    # TRL 0.14.0, which applied model_init_kwargs to nothing but a model path (and raised for an instance)
    "ignored for a model instance": lambda n: n["kernels"].update({"model instance": "eager"}),
    # a run without the fix: the Llama's padding-free losses drift from padded as OPT's do
    "follows padded step by step": lambda n: n.update(fix_gap=0.2),
    # the flag lost on the way: the default kernel
    "applies for a model path": lambda n: n["kernels"].update({"model path": "sdpa"}),
    # TRL 0.23.1's batch: position_ids and no mask
    "sends the packed row with a mask of ones": lambda n: n["then"]["collator"].update(
        attention_mask_all_ones=False, has_attention_mask=False, has_position_ids=True
    ),
    # the side environment's run with a kernel that reads the boundaries: padding-free as padded
    "over 2x padded at the largest batch": lambda n: n["then"]["losses"].update(
        ratio=[1.0] * len(n["then"]["losses"]["ratio"])
    ),
    # a forward without a cache: isolated on 4.55.4
    "contaminated in train mode with the config's cache": lambda n: [
        rows.update({"train, config use_cache=True, no mask": 6e-8}) for rows in n["then"]["differences"].values()
    ],
    # transformers 4.48.3's rows: contaminated every way
    "use_cache=False keeps packed sequences apart": lambda n: [
        rows.update({"train, use_cache=False, no mask": 0.24}) for rows in n["then"]["differences"].values()
    ],
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's sizes: a ratio per batch size (4, 16, 64; each setting's last one a
    little above the batch-16 one), a value per training step (60), bf16 (the fixed path within bf16's drift)."""
    extra = len(sizes["batch_sizes"]) - len(numbers["batch_sizes"])
    steps = sizes["train_steps"]
    numbers.update(
        precision="bf16", attention="flash_attention_2", batch_sizes=list(sizes["batch_sizes"]), fix_gap=0.02
    )
    for table in (numbers["loss_ratio"], numbers["grad_ratio"]):
        for name, r in table.items():
            table[name] = r + [r[-1] * 1.05 ** (i + 1) for i in range(extra)]
    for runs in numbers["sweep"].values():
        for mode, rows in runs.items():
            runs[mode] = rows + [dict(rows[-1]) for _ in range(extra)]
    for run in numbers["training"].values():
        for key in ("loss", "grad_norm"):
            run[key] = cycled(run[key], steps)
    losses = numbers["then"]["losses"]
    losses["batch_sizes"] = list(sizes["batch_sizes"])
    for key in ("padded", "padding_free", "ratio"):
        losses[key] = losses[key] + [losses[key][-1]] * extra
    return numbers
