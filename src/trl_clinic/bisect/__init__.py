"""``trl-clinic bisect``: the first release of a package whose first training step of a recipe changed.

    from trl_clinic.bisect import bisect, table, verdict
    pins = ["trl==0.11.4", "peft==0.13.2", "accelerate==1.0.1", "datasets", "rich"]  # lesson 02's era
    outcome = bisect("sft", {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4},
                     "transformers", "4.45.0", "4.46.0", pins=pins)
    print(table(outcome)); print(verdict(outcome, "transformers"))

Each version gets a side environment (uv, cached; ``trl_clinic.probes.environments``, shared with the
course's eras) with the rest of the stack pinned from this environment, and the recipe's trainer is built
there by that version's own TRL (``first_step.py``, standalone). A record is the first batch's hashes, the
attention pattern of one row, the label tokens, and the first step's loss and gradient norm at learning rate 0
(SFT, DPO, reward or GRPO), with the check-up's verdicts on that version's trainer; the search compares each
with the good end's (``search``). A sibling of the check-up and the watch over ``probes``: it imports neither,
nor the course (the check-up runs inside each side environment, from this project's source). Importing it loads
no torch.
"""

from trl_clinic.bisect.report import table, to_json, verdict
from trl_clinic.bisect.runner import bisect, bisect_together
from trl_clinic.bisect.search import LOSS_BOUND, Measured, Outcome, differing_parts

__all__ = [
    "LOSS_BOUND",
    "Measured",
    "Outcome",
    "bisect",
    "bisect_together",
    "differing_parts",
    "table",
    "to_json",
    "verdict",
]
