"""Era scripts: standalone programs that run the real old library code in an era's environment.

They are not imported by ``trl_clinic``: each runs as ``python then_XX.py SPEC.json RESULT.json`` with
an era's interpreter (``trl_clinic.course.eras.run_in_era``), where today's ``trl_clinic`` would not import
(it needs today's transformers). So each script depends only on torch, the era's libraries and the
standard library, reads everything it needs from its spec (no downloads, tiny models from configs),
and writes a JSON result. They ship with the package (this folder is a package for that reason).
"""
