"""Refresh the numbers the check tests start from: python tools/refresh_numbers.py WORKBOOK_OUTPUT

Copies each lesson's ``numbers`` from a cpu workbook run (``trl-clinic run --profile cpu --seed 0 --out ...``)
into its lesson's folder: ``numbers.json`` for a core, ``numbers_deeper.json`` for a deep dive
(tests/test_checks_can_fail.py reads them).
"""

import json
import sys
from pathlib import Path

from trl_clinic.course.lessons import lessons

if __name__ == "__main__":
    table = lessons()
    for metrics in sorted(Path(sys.argv[1]).glob("*/metrics.json")):
        payload = json.loads(metrics.read_text())
        if payload["profile"] != "cpu":
            sys.exit(f"{metrics}: the fixtures come from a cpu run, this is {payload['profile']}")
        lesson = table[payload["lesson"]]
        target = lesson.folder / f"numbers{'' if lesson.is_core else '_deeper'}.json"
        target.write_text(json.dumps(payload["numbers"], indent=1) + "\n")
        print(f"wrote {target}")
