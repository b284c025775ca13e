"""Helpers shared by the TRL Clinic notebooks.

Each module holds one kind of plumbing, so that a notebook can show only the TRL and transformers
calls its lesson is about: ``setup`` (parameters, profiles, device), ``tokenizer``, ``models``,
``data``, ``recording`` (trainer callbacks), ``gradients``, ``plotting`` and ``results``.
"""

__version__ = "0.1.0"
