"""``python -m trl_clinic.course.eras [--background --log F] [NAME ...]``: build eras (``make eras``, ``make test``)."""

import sys

from trl_clinic.course.eras.build import main

if __name__ == "__main__":
    sys.exit(main())
