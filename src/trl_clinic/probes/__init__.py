"""Measurements on a real batch or model, shared by the check-up, the watch and the lessons.

* ``packing``: do packed sequences in one row see each other?
* ``padding``: padding side and KV cache in scoring and generation; ``ForwardAudit`` of what a trainer's
  forwards receive;
* ``nonfinite``: the first NaN/inf parameter or gradient after an optimizer step, named;
* ``gradients``: the gradient of a real Trainer step, and comparisons;
* ``labels``: the label tokens a loss trains on, and ``IGNORE_INDEX`` (-100);
* ``recording``: raw and logged loss per step.

Part of the library: nothing here imports the course (``trl_clinic.course``).
"""
