"""The saved notebooks check their own timing claims.

A timing cell (one that holds ops to fixed times with ``op_time=``) prints, beside each
measurement, the simulator's prediction in a fixed table (``pp.measured_plots.against_prediction``).
These tests read those tables back from the *saved* outputs, recompute every gap from the printed
numbers, and fail when one is further from its prediction than the notebook's text promises (or
when the text's promise and the table's bound disagree). Nothing is executed here: the numbers
are the ones a reader sees.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from mtb_helpers.pp.measured_plots import TOLERANCE, against_prediction

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))

ROW = re.compile(r"^\| (?P<what>[^|]+?) \| (?P<quantity>\w+) \| (?P<measured>-?\d+\.\d+) \| "
                 r"(?P<predicted>-?\d+\.\d+) \| (?P<gap>[+-]\d+\.\d) (?P<unit>%|pt) \| "
                 r"(?P<allowed>\d+(?:\.\d+)?) (?P<allowed_unit>%|pt) \| (?P<within>yes|NO) \|$")
# the sentences that make the promise, and the bound each states
PROMISES = {"makespan": re.compile(r"makespan\s+within\s+(\d+)\s*%"),
            "bubble": re.compile(r"bubble fraction\s+within\s+(\d+)\s+points")}


def _timing_cells(nb) -> list:
    """Code cells that run ops held to fixed times (the explorer, a widget, draws no claim)."""
    return [c for c in nb.cells if c.cell_type == "code" and "op_time=" in c.source
            and "explore_" not in c.source]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def parse_rows(text: str) -> list[dict]:
    """Every measured-vs-predicted row of ``text`` (the tables ``against_prediction`` prints)."""
    return [m.groupdict() for line in text.splitlines() if (m := ROW.match(line.strip()))]


def gap_of(row: dict) -> float:
    """The gap recomputed from the printed measured and predicted values, in the row's unit."""
    measured, predicted = float(row["measured"]), float(row["predicted"])
    if row["unit"] == "%":
        return (measured - predicted) / predicted * 100
    return (measured - predicted) * 100


def promised(nb) -> dict[str, float]:
    """The bounds the notebook's prose states, by quantity."""
    prose = " ".join(c.source for c in nb.cells if c.cell_type == "markdown").replace("\n", " ")
    found = {}
    for quantity, pattern in PROMISES.items():
        values = {float(v) for v in pattern.findall(prose)}
        if values:
            assert len(values) == 1, f"the text promises several bounds for the {quantity}: {values}"
            found[quantity] = values.pop()
    return found


def violations(nb) -> list[str]:
    """What in the saved timing outputs breaks the text's promise (empty: every claim holds)."""
    bounds = promised(nb)
    problems = []
    timing = _timing_cells(nb)
    problems += [f"timing cell {i} prints no measured-vs-predicted table"
                 for i, cell in enumerate(timing) if not parse_rows(_text(cell))]
    # every such table anywhere in the notebook is held to the promise, timing cell or not
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        for row in parse_rows(_text(cell)):
            quantity = row["quantity"]
            if quantity not in bounds:
                problems.append(f"{row['what']}: the text states no bound for the {quantity}")
                continue
            unit, _ = TOLERANCE[quantity]
            allowed = bounds[quantity]
            if row["unit"] != unit or float(row["allowed"]) != allowed:
                problems.append(f"{row['what']} {quantity}: the table allows {row['allowed']} "
                                f"{row['allowed_unit']}, the text {allowed:g} {unit}")
            gap = gap_of(row)
            # printed to 4 decimals: the difference is known to 1e-4, the gap to 0.05
            slack = 0.05 + 0.01 * (1 / float(row["predicted"]) if unit == "%" else 1) + 1e-9
            if abs(gap - float(row["gap"])) > slack:
                problems.append(f"{row['what']} {quantity}: printed gap {row['gap']} but the printed "
                                f"values give {gap:+.2f}")
            if abs(gap) > allowed:
                problems.append(f"{row['what']} {quantity}: measured {row['measured']} is "
                                f"{gap:+.1f} {unit} from the predicted {row['predicted']}, the text "
                                f"promises within {allowed:g} {unit}")
    return problems


TIMED = [p for p in NOTEBOOKS if _timing_cells(nbformat.read(p, as_version=4))]


def test_the_course_has_timing_cells():
    assert NOTEBOOK_DIR / "09_pipeline_on_ranks.ipynb" in TIMED, \
        "notebook 09 holds no ops to fixed times: the claims below would check nothing"


@pytest.mark.parametrize("nb_path", TIMED, ids=lambda p: p.stem)
def test_saved_timing_outputs_keep_the_texts_promise(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    problems = violations(nb)
    assert not problems, (f"{nb_path.name}: saved timing outputs contradict the text (re-execute "
                          "it on an idle machine, or correct the text):\n  " + "\n  ".join(problems))


def test_the_promise_in_the_prose_matches_the_tables_bounds():
    nb = nbformat.read(NOTEBOOK_DIR / "09_pipeline_on_ranks.ipynb", as_version=4)
    assert promised(nb) == {q: bound for q, (_, bound) in TOLERANCE.items()}


def _fake_notebook(table: str, prose: str = "each measured makespan within 10 % of the "
                   "simulator's, each measured bubble fraction within 5 points (0.05)"):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("res = pipeline_step(..., op_time=OP_TIME)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=table + "\n")]
    nb.cells = [nbformat.v4.new_markdown_cell(prose), cell]
    return nb


def test_a_gap_beyond_the_promise_is_caught():
    ok = against_prediction([("1f1b m=8", "makespan", 3.40, 3.30), ("1f1b m=8", "bubble", 0.29, 0.273)])
    assert len(parse_rows(ok)) == 2 and not violations(_fake_notebook(ok))
    late = against_prediction([("zb-h1 m=8", "makespan", 1.72, 0.54), ("zb-h1 m=8", "bubble", 0.63, 0.11)])
    found = violations(_fake_notebook(late))
    assert len(found) == 2 and all("promises within" in f for f in found), found


def test_a_table_whose_bound_differs_from_the_text_or_a_missing_table_is_caught():
    ok = against_prediction([("gpipe m=1", "makespan", 1.21, 1.20)])
    looser_text = "each measured makespan within 20 % of the simulator's"
    assert any("the text 20 %" in f for f in violations(_fake_notebook(ok, looser_text)))
    assert violations(_fake_notebook("makespan 1.21 s")) == ["timing cell 0 prints no "
                                                             "measured-vs-predicted table"]
    edited = ok.replace("+0.8 %", "+0.1 %")
    assert any("printed gap" in f for f in violations(_fake_notebook(edited)))


def _sdpa_under_public_context_parallel():
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).shape


def test_notebook_11s_claim_that_public_context_parallel_refuses_cpu_still_holds():
    """Notebook 11 says PyTorch's public ``context_parallel()`` cannot run on CPU ranks, and quotes
    the error. When a torch release registers the CPU kernel this fails: show it in the notebook."""
    from mtb_helpers import RankError, run

    refusal = "does not have a sharding strategy registered"
    nb = nbformat.read(NOTEBOOK_DIR / "11_context_parallel.ipynb", as_version=4)
    prose = " ".join(c.source for c in nb.cells if c.cell_type == "markdown").replace("\n", " ")
    assert refusal in prose and "context_parallel(mesh" in prose
    with pytest.raises(RankError, match=refusal):
        run(_sdpa_under_public_context_parallel, world_size=2, timeout=30)
