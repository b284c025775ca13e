"""Lesson 05: GRPOTrainer dies with "Floating point exception (core dumped)"."""
