"""What ``import trl_clinic`` gives: ``checkup`` and ``ClinicWatch`` by name, each loaded on first use, so importing the
package stays cheap (no torch: ``trl-clinic --help`` answers without it)."""

import subprocess
import sys


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_watch_and_the_checkup_come_from_the_package_and_load_when_used():
    """Before, ``from trl_clinic import ClinicWatch`` raised ImportError while ``from trl_clinic import checkup``
    worked; the docstrings and README name both."""
    code = (
        "import sys, trl_clinic\n"
        "print('torch' in sys.modules)\n"
        "from trl_clinic import ClinicWatch, checkup\n"
        "from trl_clinic.watch.callback import ClinicWatch as watch\n"
        "print(ClinicWatch is watch, callable(checkup), 'torch' in sys.modules)"
    )
    assert run(code).splitlines() == ["False", "True True True"]


def test_an_unknown_name_is_still_an_attribute_error():
    code = "import trl_clinic\ntry:\n    trl_clinic.nothing\nexcept AttributeError as e:\n    print(e)"
    assert run(code) == "module 'trl_clinic' has no attribute 'nothing'"
