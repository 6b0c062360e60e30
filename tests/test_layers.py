"""The layer contract (pyproject's [tool.importlinter]) holds, checked by import-linter on the installed package."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_layer_contract_is_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is a dev dependency: run the README's set-up"
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def test_bare_checkout_without_dependencies_says_how_to_set_up(tmp_path):
    """`import lkat_lens` in an interpreter without torch gives one message pointing at the README's set-up."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.path.insert(0, sys.argv[1])\n"
        "try:\n    import lkat_lens\nexcept ImportError as err:\n    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=tmp_path, capture_output=True, text=True)
    assert "run the README's set-up" in done.stdout and "torch is missing" in done.stdout, done.stderr
