"""Eras: side environments with the library versions where a bug lived, and running a script in one.

Three lessons show their failure through a re-creation on today's stack, because today's libraries
fixed or removed the old code. An *era* lets a lesson run the real old code beside it. Three jobs, one
module each:

* ``spec``: finding and reading eras. ``eras/<name>.txt`` in a lesson's folder pins one era (old
  transformers, trl, peft, accelerate, torch 2.13.0 and what the old versions forgot to declare); its
  header says which lesson uses it (``requirements/`` here holds the eras no lesson owns). ``era_state`` says
  whether ``.eras/<name>/`` is built from it.
* ``runner``: ``run_in_era(name, "then_<key>", spec, workdir)`` runs lesson <key>'s standalone era script
  (``then.py`` in its folder) with the era's interpreter and returns its JSON result; a missing era is
  ``skipped``, a broken script ``failed``; nothing raises into the notebook.
* ``build``: ``make eras`` (``python -m trl_clinic.course.eras [NAME ...]``) builds ``.eras/<name>/``
  with uv, once: a stamp records the SHA-256 of the requirements file, so an era is rebuilt only when
  its file changes, and a failed build leaves no stamp; a file lock and a background process let
  ``make lab`` and ``make test`` start before the build ends.

The contract of an era script (they cannot import ``trl_clinic``: its code needs today's libraries):
``python then.py SPEC.json RESULT.json``; the spec is a JSON object written by the notebook (paths
in it are absolute), the result a JSON object the script writes before it exits 0. Large arrays (a
gradient) go to a ``.pt`` file whose path the spec names; ``trl_clinic.course.handshake`` builds the specs
and reads those files on today's side.

The era files are package data, so a wheel install has them too; the eras are built under the checkout
(``.eras/``) or, outside one, under the clinic's cache folder, on a lesson's first use
(``trl_clinic.course.paths``). The names a lesson uses are gathered here
(``eras.run_in_era``, ``eras.era_state``); a test that replaces one patches the module that holds it.
Nothing in this package imports torch.
"""

from trl_clinic.course.eras.build import EraBuildError, build_era, local_torch_links, uv_command, wait_for_builds
from trl_clinic.course.eras.runner import EraRun, run_in_era, then_script
from trl_clinic.course.eras.spec import (
    CHILD_ENV,
    STAMP,
    builds_on_demand,
    era_dir,
    era_names,
    era_python,
    era_state,
    era_versions,
    read_stamp,
    requirements_digest,
    requirements_file,
    requirements_files,
)

__all__ = [
    "CHILD_ENV",
    "STAMP",
    "EraBuildError",
    "EraRun",
    "build_era",
    "builds_on_demand",
    "era_dir",
    "era_names",
    "era_python",
    "era_state",
    "era_versions",
    "local_torch_links",
    "read_stamp",
    "requirements_digest",
    "requirements_files",
    "requirements_file",
    "run_in_era",
    "then_script",
    "uv_command",
    "wait_for_builds",
]
