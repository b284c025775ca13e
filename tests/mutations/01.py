"""Lesson 01 (core): how a run without the bug, or without the fix, changes the numbers, one mutation per check
(the part of the check's name it matches -> a change of the numbers such a run could produce; the comment names
the real run it stands for).

The gpu profile keeps the core's tiny copy-task Llama: the symptom runs on the report's own libraries,
in a side environment that sees no GPU (TRL 0.14.0 and transformers 4.48.3 on CPU), and the comparison with today
needs the same weights on both sides. On the gpu profile today's half runs with the best FlashAttention installed
(else sdpa) in bf16, on batch sizes 1, 4, 16 and 64 over 256 examples. Each threshold, argued for those sizes:
- "over 2x the padded loss at the largest batch", "grows with the batch size": the side environment runs on CPU in
  fp32 whatever the profile, so only the batch sizes change: 4.9x at batch 4 and 6.0x at 16 at seed 0 (seeds 1-5 in
  make test-slow); a batch of 64 packs four times more foreign prompts before each sequence, so its ratio is at
  least the batch-16 one (the share of foreign keys a token sees only grows with the row).
- "padding-free equals padded at every batch size", "today's padded loss at batch 1 equals TRL 0.14's": 1e-4 in
  fp32 (measured: 1e-7, float rounding); 2e-2 in bf16 (8 bits of mantissa: a relative rounding of 4e-3 per
  operation, and FlashAttention's varlen and padded kernels sum in other orders).
- "portable check: the Llama's later sequences differ no more than rounding": later <= 10 x the first sequence's
  difference + the same 1e-4 / 2e-2 (fp32: later 7e-6 against a first of 1e-6; bf16 logits of about 10 differ by
  up to 4e-2 from rounding alone, which the 10x of the first sequence's difference covers).
- "portable check flags OPT ... over 1e-2": OPT built by hand keeps sdpa on every profile; 0.55 at random init in
  fp32, fifty times the bar; bf16 autocast adds at most 2e-2 of rounding to a difference of that size.
- "block-diagonal", "lets tokens attend across sequence boundaries", "sends position_ids and no attention mask",
  "checkup's packing probe fails the OPT trainer": counts and names, the same at any size.
"""

MUTATIONS = {
    # OPT on a kernel that reads the boundaries (FlashAttention on a GPU): its sequences kept apart like the Llama's
    "portable check flags OPT": lambda n: n["portable"].update(OPT=list(n["portable"]["Llama"])),
    # the same run seen by the check-up
    "packing probe fails the OPT trainer": lambda n: n.update(checkup="ok"),
    # a run without the bug on the old side (a kernel that reads the boundaries): padding-free equals padded there too
    ("over 2x the padded loss", "grows with the batch size"): lambda n: n["then"]["losses"].update(
        ratio=[1.0] * len(n["then"]["losses"]["ratio"])
    ),
    # a run where the contamination saturated: the largest batch no worse than the one before
    "grows with the batch size": lambda n: n["then"]["losses"]["ratio"].__setitem__(
        -1, n["then"]["losses"]["ratio"][-2]
    ),
    # TRL 0.19.0-0.23.0's collator on sdpa: a mask of ones and no position_ids (the deep dive's era)
    "sends position_ids and no attention mask": lambda n: n["then"]["collator"].update(
        has_attention_mask=True, has_position_ids=False
    ),
    # the old side on a kernel that reads boundaries: a block-diagonal pattern
    "lets tokens attend across sequence boundaries": lambda n: n["foreign_cells"].update(
        {"TRL 0.14 + transformers 4.48.3": 0}
    ),
    # a run without the fix: TRL 0.14's ratios on today's side
    "padding-free equals padded at every batch size": lambda n: n["today"].update(
        ratio=list(n["then"]["losses"]["ratio"])
    ),
    # today's row sent with a mask of ones or a cache: one causal mask over the row, as the old side
    "block-diagonal": lambda n: n["foreign_cells"].update(
        {"today's transformers": n["foreign_cells"]["TRL 0.14 + transformers 4.48.3"]}
    ),
    # a run without the fix on the Llama: its packed sequences as mixed as OPT's
    "the Llama's later sequences": lambda n: n["portable"].update(Llama=list(n["portable"]["OPT"])),
    # another model or other examples handed over: today's padded loss no longer the old side's
    "padded loss at batch 1 equals": lambda n: n["today"]["padded"].__setitem__(0, n["today"]["padded"][0] * 1.1),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The cpu numbers at the gpu profile's sizes: a value per batch size (1, 4, 16, 64) on both sides, today's in
    bf16 on FlashAttention (ratios within bf16 rounding of 1), the portable check's differences at bf16's scale."""
    extra = len(sizes["batch_sizes"]) - len(numbers["today"]["batch_sizes"])
    numbers.update(precision="bf16", attention="flash_attention_2")
    today, old = numbers["today"], numbers["then"]["losses"]
    for side in (today, old):
        side["batch_sizes"] = list(sizes["batch_sizes"])
        side["padded"] = side["padded"] + [side["padded"][-1]] * extra
    today["padding_free"] = [p * (1.004 if i % 2 else 0.996) for i, p in enumerate(today["padded"])]
    today["ratio"] = [f / p for f, p in zip(today["padding_free"], today["padded"])]
    old["ratio"] = old["ratio"] + [old["ratio"][-1] * 1.05 ** (i + 1) for i in range(extra)]
    old["padding_free"] = [r * p for r, p in zip(old["ratio"], old["padded"])]
    numbers["portable"]["Llama"] = [0.0156] + [0.031] * (len(numbers["portable"]["Llama"]) - 1)
    numbers["portable"]["OPT"] = [0.0156] + [x + 0.02 for x in numbers["portable"]["OPT"][1:]]
    return numbers
