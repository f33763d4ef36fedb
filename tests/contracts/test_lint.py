"""The linter configured in pyproject.toml ([tool.ruff]) finds nothing.

CI runs the README's test command only, so the lint runs here: a new
unused import, undefined name, loop-variable closure (bugbear B023) or
over-long line fails the suite with ruff's own report.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff():
    found = shutil.which("ruff", path=str(Path(sys.executable).parent))
    found = found or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install -e '.[dev]' installs it")
    return found


def test_ruff_finds_nothing():
    proc = subprocess.run([_ruff(), "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_reads_the_projects_configuration(tmp_path):
    # A file with an unused import must be reported under this config: a
    # configuration that silently selected nothing would pass the test above.
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    proc = subprocess.run(
        [_ruff(), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
         str(bad)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "F401" in proc.stdout, proc.stdout
