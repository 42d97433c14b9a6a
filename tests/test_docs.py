"""The README's Python examples, the notebook and the docstring examples run."""
import json
import os
import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_python_blocks_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    # The torchrun block needs several processes: tests/test_distributed.py runs it.
    blocks = [block for block in blocks if not block.startswith("# torchrun")]
    assert len(blocks) >= 5
    namespace = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the export example writes weight_grad.pt2
    try:
        exec("import torch, torch_convgrad", namespace)
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert namespace["dw"].shape == (3, 3, 16, 64)
    assert namespace["per_sample"].shape == (32, 64, 64, 3, 3)
    assert (tmp_path / "weight_grad.pt2").exists()


def test_notebook_cells_run(monkeypatch):
    notebook = json.loads((ROOT / "notebooks" / "tour.ipynb").read_text())
    cells = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert len(cells) >= 4
    monkeypatch.chdir(ROOT / "notebooks")  # the notebook puts its parent folder on sys.path
    namespace = {}
    for cell in cells:
        exec(compile(cell, "tour.ipynb", "exec"), namespace)
    assert namespace["per_sample"].shape == (16, 4, 3, 3, 3)


@pytest.mark.parametrize("module, examples", [("functional", 8), ("algorithms", 2)])
def test_docstring_examples_run(module, examples):
    import doctest
    import importlib

    import torch_convgrad

    module = importlib.import_module(f"torch_convgrad.{module}")
    results = doctest.testmod(module, optionflags=doctest.ELLIPSIS,
                              extraglobs={"torch": torch, "torch_convgrad": torch_convgrad})
    assert results.attempted >= examples
    assert results.failed == 0
