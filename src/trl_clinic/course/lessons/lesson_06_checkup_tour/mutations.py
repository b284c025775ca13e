"""Lesson 06 (core): the check-up on your own trainer. The lesson records both runs side by side
(``numbers["runs"]``): ``without_fix`` (your OPT trainer loaded in fp16 with padding-free batches, and each other
lesson's trap) and ``with_fix`` (padding_free=False and float32 weights, and each trap's fix line), each with the
same measurements: the check-up's statuses and exit code, the packed row token by token (None where nothing is
packed), the pasted check, the packing probe's number, and the trap's finding. ``changed`` (the fingerprint) is the
check-up's promise, measured on the fixed trainer: both runs share it.

Margins, each argued from the experiment (spread over seeds 0-5, one thread, cpu profile: ``SPREAD`` below):
- "first sequence differs by rounding only (below 4 units in the last place ...)": the first sequence of a packed row
  attends to exactly the tokens it attends to alone, so its difference is the kernel's rounding of a different
  matrix shape; at fp16 weights 4 ulps at the logits' size (eps 9.8e-4 x 0.9 to 1.2) is 3.4e-3 to 4.5e-3 and the
  rounding was 6.8e-4 to 7.3e-4: 4.7x to 6.2x below, 4x argued. The fixed run has no packed row (None): it cannot pass,
  so the check is held against its mutation, a first sequence contaminated as the second is (0.47 to 0.90, 122x to
  210x above the line): 100x argued, which a line loosened tenfold breaks.
- "second sequence's first token already differs beyond the probe's tolerance": the contamination changes what the
  token attends to, 0.47 to 0.90 in the logits, against a tolerance of 3.4e-3 to 4.5e-3: 122x to 210x measured, 100x
  argued. Held against its mutation, a second sequence whose first token differs by rounding only, as the first
  sequence does (4.7x to 6.2x under the line): 4x argued, which a line loosened halfway to it (2.2x) breaks.
- "the pasted check finds the packing probe's number (... within 1 %)": the pasted check and the probe run the same
  model on the same first rows; both take the largest change of a later sequence, so they agree to rounding (0 at
  every seed). The 1 % line is argued 1000x from rounding (a relative difference of fp16 logits below 1e-5 is
  counted as 0 apart; a zero agreement is infinitely far). Held against its mutation, a pasted check that read the
  first sequence in place of the later ones (100 % off, 100x the line): 50x argued.
- "Qwen2 with use_cache=True runs right-padded forwards with a cache" (a count of forwards above 0.5): counts are
  whole numbers, so the line sits at least 0.5 from the symptom's 1 or more and from the fix's 0.

The gpu profile runs the same tiny trainers and the same sizes on a GPU (``gpu_shape``): the statuses, exit codes,
counts and the fingerprint's parts are verdicts and equalities of state, the same at any size and on any device;
the row's numbers scale with the dtype's eps and the logits' size, both measured in the run (bf16 autocast does not
touch your fp16 weights' forward, which runs no autocast in the mechanism cell and the pasted check).
"""

from trl_clinic.course.mutations import linear, log, other_run

# seeds 0-5, one thread, cpu profile (min, max over the six runs), measured for the margins above
SPREAD = {
    "first sequence's largest difference (rounding)": (6.8e-4, 7.3e-4),
    "4 ulps at the logits' size (the line)": (3.4e-3, 4.5e-3),  # 4.7x to 6.2x above the rounding
    "second sequence's first token": (0.47, 0.90),  # 122x to 210x the tolerance
    "pasted check against the probe (relative)": (0.0, 0.0),
    "right-padded forwards with a cache, use_cache=True / False": (2, 0),  # 2 and 0 at every seed
}


OTHER_RUN = other_run("without_fix", "with_fix")

SHARED = {
    "one training step changes the weights": "the fingerprint's own proof that it sees a change: one step of the fixed "
    "trainer, whichever run the lesson compares; the check-up's promise is not what the fix lines change",
    "check-up changed no part of the trainer": "the check-up's promise on any trainer, bad or fixed; the lesson "
    "fingerprints the fixed one",
}

MUTATIONS = {
    # a training step at learning_rate=0: AdamW's state fills, the weights stay as they were
    "one training step changes the weights": lambda n: n["changed"]["training step"].remove("weights and buffers"),
    # the check-up at 10f24a0, whose untouched() did not restore model.config
    "check-up changed no part of the trainer": lambda n: n["changed"].update({"check-up": ["model config"]}),
    # a packed row whose first sequence is contaminated as the second is (a mask that ignores the boundary)
    "first sequence differs by rounding only": lambda n: n["runs"]["without_fix"]["by_token"].update(
        first=n["runs"]["without_fix"]["by_token"]["second"]
    ),
    # a second sequence whose first token differs by rounding only, as the first sequence does
    "second sequence's first token already differs": lambda n: n["runs"]["without_fix"]["by_token"][
        "second"
    ].__setitem__(0, max(n["runs"]["without_fix"]["by_token"]["first"])),
    # a pasted check that read the first sequence's difference in place of the later ones'
    "pasted check finds the packing probe's number": lambda n: n["runs"]["without_fix"]["pasted"].__setitem__(
        1, n["runs"]["without_fix"]["pasted"][0]
    ),
}

MARGINS = {
    "first sequence differs by rounding only": log(4, 100),
    "second sequence's first token already differs": log(100, 4),
    "pasted check finds the packing probe's number": log(1000, 50),
    "Qwen2 with use_cache=True runs": linear(0.5, 0.5),
}


def gpu_shape(numbers: dict, sizes: dict) -> dict:
    """The gpu profile has the cpu profile's sizes (rows, batches, accumulation, groups): the same shape."""
    assert {k: sizes[k] for k in ("rows", "batch_size", "accumulation", "packed_batch_size", "grpo_batch_size")} == {
        "rows": 16,
        "batch_size": 2,
        "accumulation": 4,
        "packed_batch_size": 4,
        "grpo_batch_size": 16,
    }
    return numbers
