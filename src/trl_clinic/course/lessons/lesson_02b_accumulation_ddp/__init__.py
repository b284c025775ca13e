"""Lesson 02b: Gradient accumulation across processes (DDP)."""
