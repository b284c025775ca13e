"""The library's floor: measurements on a real batch, model or run, and what the check-up and the watch share.

* ``packing``: do packed sequences in one row see each other?
* ``padding``: padding side and KV cache in scoring and generation; ``ForwardAudit`` of what a trainer's
  forwards receive;
* ``batches``: where a collator put each sample (packed or padded rows);
* ``nonfinite``: the first NaN/inf parameter or gradient after an optimizer step, named;
* ``gradients``: the gradient of a real Trainer step, and comparisons;
* ``labels``: the label tokens a loss trains on, and ``IGNORE_INDEX`` (-100);
* ``recording``: raw and logged loss per step, and the tap on ``training_step``;
* ``finding``: the ``Finding`` every check-up probe and watch check leaves, and how it was decided (``DECISIONS``);
* ``command``: the shape of ``trl-clinic checkup|watch sft|dpo|reward|grpo|kto``, TRL's own script run;
* ``jsonable``: numbers as JSON, non-finite ones included;
* ``launch``: how the run is launched (DeepSpeed ZeRO, FSDP, DDP, one process), its precision and master weights.

Part of the library: nothing here imports the course (``trl_clinic.course``), the check-up or the watch
(``tests/test_rooms.py``); the lessons use these probes too.
"""
