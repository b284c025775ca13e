"""TRL Clinic: catch the TRL training failures people hit, in your own trainer, and the course that explains them.

Two rooms:

* the library, which installs beside your own torch/transformers/TRL: ``checkup`` (before training:
  ``from trl_clinic import checkup; checkup(trainer)``), built on ``probes`` (measurements on a real batch or model);
* the course (``trl_clinic.course``): the lessons' runs, material, stand-ins, eras and the workbook runner.

The library never imports the course.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``checkup`` loads on first use, so importing trl_clinic stays cheap."""
    if name == "checkup":
        import importlib

        return importlib.import_module("trl_clinic.checkup")
    raise AttributeError(f"module 'trl_clinic' has no attribute {name!r}")
