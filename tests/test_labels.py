"""The label tokens a loss trains on (``trl_clinic.probes.labels``), counted one way for the check-up, the watch
and the lessons: labels other than the ignore index after a causal LM's shift, or GRPO's completion mask."""

import torch

from trl_clinic.probes.labels import IGNORE_INDEX, label_tokens, targets


def test_targets_shift_the_labels_and_leave_out_the_ignore_index():
    labels = torch.tensor([[5, IGNORE_INDEX, 7, 8], [IGNORE_INDEX, 6, IGNORE_INDEX, IGNORE_INDEX]])
    assert targets({"labels": labels}).tolist() == [[False, False, True, True], [False, True, False, False]]
    assert int(label_tokens({"labels": labels})) == 3


def test_a_completion_mask_counts_where_there_are_no_labels():
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    assert targets({"completion_mask": mask}).tolist() == [[False, True, True], [False, False, True]]
    assert int(label_tokens({"completion_mask": mask})) == 3


def test_a_loss_that_is_not_over_tokens_has_no_label_count():
    assert targets({"input_ids": torch.zeros(2, 3)}) is None
    assert label_tokens({"labels": torch.tensor([0, 1])}) is None  # a classification label per row
    assert label_tokens([{"prompt": "x"}]) is None  # GRPO's prompts, before generation
