"""``usg doctor parity --torch FILE.py:NAME``: a misspelt factory name says which ones the file defines."""

from __future__ import annotations

from pathlib import Path

import pytest

from usg.doctor.parity.export import load_factory
from usg.errors import UsageError


def test_a_misspelt_factory_names_the_close_match_and_the_functions_defined(tmp_path: Path) -> None:
    module = tmp_path / "models.py"
    module.write_text(
        "from os.path import join\n\n"
        "def interp_align_false():\n    return None, None\n\n"
        "def attention():\n    return None, None\n\n"
        "def _helper():\n    pass\n"
    )
    assert callable(load_factory(f"{module}:attention"))
    # was "has no callable 'interp_align_fals'", with no fix
    with pytest.raises(
        UsageError, match=r"has no callable 'interp_align_fals'; fix: did you mean .*models\.py:interp_align_false\?"
    ) as exc:
        load_factory(f"{module}:interp_align_fals")
    assert exc.value.args[0].endswith("(model, example_inputs): attention, interp_align_false")  # not join, not _helper
