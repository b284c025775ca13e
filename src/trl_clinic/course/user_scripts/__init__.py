"""Scripts as a user writes them, run as files by the lessons (``python train_grpo.py SPEC.json``, lesson 05),
so that the lesson shows the process a user starts, not a function of the course. A folder apart from
a lesson's ``companion.py``: a companion is the lesson's bookkeeping, this is the learner's own code. A package so that
the lesson's forked trials can also import what the script builds.
"""
