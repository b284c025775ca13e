"""Lesson 04: Qwen2 + FlashAttention-2: right padding breaks DPO evaluation."""
