"""Era scripts: standalone programs that run the real old library code in an era's environment.

Each runs as ``python then_XX.py SPEC.json RESULT.json`` with an era's interpreter
(``trl_clinic.course.eras.run_in_era``), where today's ``trl_clinic`` would not import (it needs today's
transformers). So a script imports nothing of ``trl_clinic`` (``tests/test_eras.py`` checks it), depends only
on torch, the era's libraries and the standard library, reads everything it needs from its spec (no downloads,
tiny models from configs), and writes a JSON result. The dependency goes one way only: today's side may import
a script to share what both sides must agree on (lesson 01's companion takes ``then_01_padding_free``'s copy
task, its vocabulary, template and tokenizer, so that both sides train on the same tokens). They ship with the
package (this folder is a package for that reason).
"""
