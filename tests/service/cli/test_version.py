"""`tandem --version` / `-V`: the installed distribution's version, else pyproject's."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest

from service.cli.main import main
from service.cli.version import tandem_version


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_distributions_version_and_exits_0(flag: str, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.8.7" if name == "mlx-tandem" else "?")
    with pytest.raises(SystemExit) as done:
        main([flag])
    assert done.value.code == 0
    assert capsys.readouterr().out == "tandem 9.8.7\n"


def test_a_checkout_without_the_dist_reads_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "mlx-tandem"\nversion = "1.2.3"\n')
    assert tandem_version(pyproject) == "1.2.3"
    assert tandem_version(tmp_path / "none.toml") == "unknown"
    # the checkout's own pyproject, as `tandem --version` reads it without the dist
    assert tandem_version() == __import__("tomllib").loads(
        (Path(__file__).parents[3] / "pyproject.toml").read_text())["project"]["version"]
