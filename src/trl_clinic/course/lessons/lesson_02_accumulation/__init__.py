"""Lesson 02: Gradient accumulation trains worse than the same batch."""
