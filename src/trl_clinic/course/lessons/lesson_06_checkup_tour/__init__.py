"""Lesson 06: Check your own trainer before it trains."""
