"""TRL Clinic: catch the TRL training failures people hit, in your own trainer, and the course that explains them.

Two rooms:

* the library, which installs beside your own torch/transformers/TRL: ``checkup`` before training
  (``from trl_clinic import checkup; checkup(trainer)``, or ``trl-clinic checkup sft --config recipe.yaml``) and
  the watch during it (``from trl_clinic import ClinicWatch``;
  ``trainer.add_callback(ClinicWatch(trainer=trainer))``, or ``trl-clinic watch sft --config recipe.yaml``);
* the course (``trl_clinic.course``): the lessons' runs, material, stand-ins, eras and the workbook runner.

How the library is laid out. ``probes/`` is the floor: the measurements on a real batch, model or run, and what
the check-up and the watch share (the ``Finding`` record and its ``DECISIONS`` in ``probes.finding``, the label
tokens and ``IGNORE_INDEX`` in ``probes.labels``, the ``trl-clinic checkup|watch sft|dpo|reward|grpo|kto`` command
shape in ``probes.command``). ``checkup/`` (probes run once on a built trainer) and ``watch/`` (a callback over a
real run, with its ``WatchConfig`` and the catalogue of what it says) are siblings on that floor: neither imports
the other, ``probes/`` imports neither, and none of the three imports the course. ``tests/test_rooms.py`` reads
every module's imports, deferred ones included, and keeps these rules.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``checkup`` and ``ClinicWatch`` load on first use (with torch), so importing trl_clinic stays cheap."""
    import importlib

    if name == "checkup":
        return importlib.import_module("trl_clinic.checkup")
    if name == "ClinicWatch":
        return importlib.import_module("trl_clinic.watch.callback").ClinicWatch
    raise AttributeError(f"module 'trl_clinic' has no attribute {name!r}")
