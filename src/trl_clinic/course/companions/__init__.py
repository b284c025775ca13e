"""Companions: what one lesson needs and a learner need not read (its sweep loops, its multi-panel
figures, its bookkeeping), one module per lesson, as LLMs-from-scratch keeps ``previous_chapters.py``
beside each chapter. Each module's docstring names its notebook; the notebook keeps the lines that
show the bug and the fix. Reusable probes stay in the toolbox modules (``packing``, ``gradients``, ...).
"""
