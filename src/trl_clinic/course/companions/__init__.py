"""Companions: what one lesson needs and a learner need not read (its sweep loops, its multi-panel
figures, its bookkeeping), as LLMs-from-scratch keeps ``previous_chapters.py`` beside each chapter.

One module per notebook that needs one, named by the lesson's key as the rest of the repository is
(``then/then_NN_*.py``, ``eras/requirements/NN-*.txt``, ``tests/mutations/NN.py``): ``lesson_NN_<topic>.py`` for a core
(and its deep dive where they share it), ``lesson_NN_<topic>_deeper.py`` for a deep dive's own. Each
module's docstring names its notebook; the notebook keeps the lines that show the bug and the fix.
Reusable probes stay in the library (``trl_clinic.probes``: ``packing``, ``gradients``, ...).
"""
