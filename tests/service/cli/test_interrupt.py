"""Ctrl-C at any moment of a `tandem` command exits 130 without a traceback, its first second (imports) included."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import main

_ROOT = Path(__file__).resolve().parents[3]

# A child that starts as the console script does (`from service.cli import main`), announces when the import of
# service.cli reaches its commands' modules, and waits there for the signal instead of finishing the import.
_CHILD = """
import importlib.abc, os, signal, sys

class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "service.cli.main":
            sys.meta_path.remove(self)
            os.write(1, b"importing\\n")
            signal.pause()
        return None

sys.meta_path.insert(0, Hold())
from service.cli import main
sys.exit(main(["openapi", "--check"]))
"""


def test_ctrl_c_while_the_modules_load_exits_130_quietly() -> None:
    # The handler in main() came only after the imports: Ctrl-C then gave a KeyboardInterrupt traceback and a
    # death by SIGINT.
    child = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"importing\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130 and b"Traceback" not in err, (child.returncode, err.decode())


def test_ctrl_c_while_the_blas_loads_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.backend

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.backend, "ensure_fast_blas", interrupted)
    try:
        code: int | None = main(["openapi", "--check"])
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole test session
        code = None
    assert code == 130
