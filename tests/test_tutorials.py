"""Every tutorial runs as part of the suite, so none of them rots."""
import pathlib
import runpy
import sys

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).parent.parent / "tutorials").glob("[0-9][0-9]_*.py"))
# the optional packages a tutorial needs (it says so and exits when one is
# missing; here it is skipped instead): the [torch] and [examples] extras
NEEDS = {"06_training_in_pytorch": ("torch", "sklearn", "matplotlib")}


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(path, capsys, tmp_path, monkeypatch):
    for module in NEEDS.get(path.stem, ()):
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)          # tutorials may write pictures: keep them out of the tree
    monkeypatch.setattr("sys.path", list(sys.path))     # and may add a directory to it
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip(), f"{path.name} printed nothing"


def test_tutorials_exist():
    assert [p.stem[:2] for p in TUTORIALS][:1] == ["01"]
