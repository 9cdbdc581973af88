"""Execute notebooks top to bottom in a fresh kernel and save them with their outputs.

    python scripts/execute_notebook.py notebooks/01_column_parallel.ipynb [more.ipynb ...]

Run from the repository root. Execution counts come out 1..n; kernel metadata that names this
machine (paths, widget state ids) is dropped so the saved file is the same on every machine.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 600) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            store_widget_state=True)
    client.execute()
    nb.metadata.pop("widgets", None) if not _has_widget_views(nb) else None
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.get("language_info", {}).pop("version", None)
    nbformat.write(nb, path)


def _has_widget_views(nb) -> bool:
    return any(o.get("data", {}).get("application/vnd.jupyter.widget-view+json")
               for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"executing {arg}", flush=True)
        execute(Path(arg))
