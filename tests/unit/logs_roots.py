"""What the log doctor's rule tests share: the root error `usg doctor logs` reads in a pasted text
(signature rules only, no learned layer), imported by the test_doctor_logs_* modules."""

from __future__ import annotations

from usg.doctor.findings import Finding
from usg.doctor.logs.classify import classify_text, root_error


def root_of(text: str) -> Finding:
    """The root error of ``text`` as pasted; fails the test when there is none."""
    root = root_error(classify_text(text, "pasted.log", learned=False))
    assert root is not None, f"no root error in {text!r}"
    return root
