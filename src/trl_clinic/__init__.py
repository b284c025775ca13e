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
* the ``trl-clinic`` command: ``workbook``, ``report``, ``doctor``, ``cli``;
* your own trainer: ``checkup`` (``from trl_clinic import checkup; checkup(trainer)``).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``checkup`` loads on first use, so importing trl_clinic stays cheap."""
    if name == "checkup":
        import importlib

        return importlib.import_module("trl_clinic.checkup")
    raise AttributeError(f"module 'trl_clinic' has no attribute {name!r}")
