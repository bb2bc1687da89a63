"""Every tutorial runs as part of the suite, so none of them rots."""
import pathlib
import runpy

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).parent.parent / "tutorials").glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(path, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # tutorials may write pictures: keep them out of the tree
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip(), f"{path.name} printed nothing"


def test_tutorials_exist():
    assert [p.stem[:2] for p in TUTORIALS][:1] == ["01"]
