"""Lesson 07: Watch your run: a NaN caught at the step it starts."""
