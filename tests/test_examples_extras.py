"""The HF and Lightning examples, run without their extra, name the extra to install instead
of failing with a bare ModuleNotFoundError."""

from __future__ import annotations

import os
import subprocess

import pytest
from integration_support import EXAMPLES, PYTHON, REPO

_BLOCK = ("import runpy, sys; sys.modules[{module!r}] = None; sys.argv = [{path!r}]; "
          "runpy.run_path({path!r}, run_name='__main__')")


@pytest.mark.parametrize("example, module, extra", [
    ("hf_trainer.py", "transformers", "'.[hf]'"),
    ("lightning_trainer.py", "lightning", "'.[lightning]'"),
])
def test_an_example_without_its_extra_says_which_extra_to_install(example, module, extra):
    path = str(EXAMPLES / example)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([PYTHON, "-c", _BLOCK.format(module=module, path=path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1
    assert f"pip install -e {extra}" in proc.stderr and repr(module) in proc.stderr
    assert "Traceback" not in proc.stderr
