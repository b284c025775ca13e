"""Lesson 03: LoRA reward model: loss 1e+34, grad norm NaN, then loss 0."""
