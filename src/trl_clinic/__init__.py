"""Helpers shared by the TRL Clinic notebooks.

Each module holds one kind of plumbing, so that a notebook can show only the TRL and transformers
calls its lesson is about:

* the run: ``lessons`` (the lesson table, ``lessons.yaml``), ``profiles``, ``parameters``, ``runtime``;
* the material: ``tokenizer``, ``models``, ``data``;
* the probes: ``recording``, ``nonfinite``, ``gradients``, ``packing``, ``padding``, ``crash``;
* processes: ``child`` (a lesson's function in a child process), ``launch`` (several processes);
* stand-ins: ``stand_ins`` (old behaviour re-created, faults injected, each labelled);
* the past, for real: ``eras`` (side environments with old versions), ``handshake``, ``then/`` scripts;
* the output: ``plotting``, ``results``;
* the ``trl-clinic`` command: ``workbook``, ``report``, ``doctor``, ``cli``.
"""

__version__ = "0.1.0"
