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


# ----------------------------------------------------------- sentences that cite a saved output
# Notebooks 13 and 14 state numbers their code cells print. A claim is tagged where it is made: the
# number, its unit, then an HTML comment naming the output it cites, ``25.42 ms<!--out:ddp-predict-->``
# (invisible on GitHub, Colab and JupyterLab). The code cell carries the tag ``out:ddp-predict`` in
# its metadata. Each claim must agree with a number that cell printed: equal once rounded to the
# claim's decimals, with the claim's unit and sign when it states them.

CITING = ["13_communication_cost.ipynb", "14_hiding_communication.ipynb"]
CLAIM = re.compile(r"(?P<number>[+-]?\d+(?:\.\d+)?)\s?(?P<unit>[^\s\d<`*]*)[`*]*<!--\s*out:(?P<tag>[\w-]+)\s*-->")
PRINTED = re.compile(r"(?P<number>[+-]?\d+(?:\.\d+)?)\s?(?P<unit>[^\s\d]*)")
# numbers printed at the model's precision: in the lesson's prose they must cite their output
MODEL_PRECISION = re.compile(r"(?<![\d.])\d+\.\d\d ms\b")


def _unit(text: str) -> str:
    return text.rstrip(".,;:)]'\"")


def tagged_outputs(nb) -> tuple[dict[str, str], list[str]]:
    """tag -> what the code cell tagged ``out:<tag>`` printed; and tags found on several cells."""
    found, twice = {}, []
    for cell in nb.cells:
        for tag in cell.get("metadata", {}).get("tags", []):
            if cell.cell_type == "code" and tag.startswith("out:"):
                if tag[4:] in found:
                    twice.append(tag[4:])
                found[tag[4:]] = "".join(o.get("text", "") for o in cell.get("outputs", [])
                                         if o.get("output_type") == "stream")
    return found, twice


def agrees(number: str, unit: str, printed: str) -> bool:
    """Whether ``printed`` holds ``number`` (rounded to its decimals) with ``unit`` (if any)."""
    value = float(number)
    decimals = len(number.split(".")[1]) if "." in number else 0
    for m in PRINTED.finditer(printed):
        x = float(m.group("number"))
        if number[0] not in "+-":
            x = abs(x)
        if abs(x - value) <= 0.5 * 10 ** -decimals + 1e-9 and (not unit or _unit(m.group("unit")) == unit):
            return True
    return False


def claim_problems(nb) -> list[str]:
    """Every tagged claim that cites no output, or disagrees with the output it cites, and every
    untagged number at the model's precision in the lesson's prose (solutions and code spans, which
    hold the inputs and formulas, excepted)."""
    outputs, twice = tagged_outputs(nb)
    problems = [f"the tag out:{t} is on several code cells" for t in twice]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = cell.source.replace("\n", " ")
        for m in CLAIM.finditer(text):
            number, unit, tag = m.group("number"), _unit(m.group("unit")), m.group("tag")
            if tag not in outputs:
                problems.append(f"cell {i}: {number} {unit} cites out:{tag}, which no code cell carries")
            elif not agrees(number, unit, outputs[tag]):
                problems.append(f"cell {i}: {number} {unit} disagrees with what out:{tag} printed: "
                                f"{outputs[tag].strip()[:300]!r}")
        lesson = re.sub(r"<details>.*?</details>", " ", text)
        untagged = re.sub(r"`[^`]*`", " ", CLAIM.sub(" ", lesson))    # code spans: inputs, formulas
        problems += [f"cell {i}: {m.group(0)!r} is at the model's precision but cites no output "
                     "(tag it: <!--out:NAME-->)" for m in MODEL_PRECISION.finditer(untagged)]
    return problems


@pytest.mark.parametrize("name", CITING)
def test_numbers_in_the_text_agree_with_the_saved_outputs_they_cite(name):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    claims = [m for c in nb.cells if c.cell_type == "markdown" for m in CLAIM.finditer(c.source)]
    assert len(claims) >= 4, f"{name}: only {len(claims)} tagged claims; the check would check little"
    problems = claim_problems(nb)
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)


def _citing_notebook(prose: str, printed: str = "overlap   : step 25.42 ms = compute 21.00 ms "
                     "+ exposed comm 4.42 ms\nratio 2.8× the compute, gap +3.9%\n"):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(...)")
    cell.metadata["tags"] = ["out:step"]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    nb.cells = [cell, nbformat.v4.new_markdown_cell(prose)]
    return nb


def test_a_sentence_that_contradicts_its_output_is_caught():
    agreeing = ("The step takes 25.42 ms<!--out:step-->, about 25.4 ms<!--out:step-->, of which "
                "4.42 ms<!--out:step--> is exposed: 2.8×<!--out:step--> (`+3.9 %`<!--out:step-->).")
    assert claim_problems(_citing_notebook(agreeing)) == []
    for wrong, why in (("The step takes 25.40 ms<!--out:step-->.", "disagrees"),
                       ("The step takes 25.42 µs<!--out:step-->.", "disagrees"),      # the unit
                       ("The gap is -3.9 %<!--out:step-->.", "disagrees"),           # the sign
                       ("The step takes 25.42 ms<!--out:steps-->.", "no code cell carries"),
                       ("The step takes 29.88 ms, measured or not.", "cites no output")):
        found = claim_problems(_citing_notebook(wrong))
        assert len(found) == 1 and why in found[0], (wrong, found)


def test_a_tag_on_two_cells_and_solutions_are_told_apart():
    nb = _citing_notebook("<details><summary>Solution</summary>\n\n`6 + 20.42 + 1 = 27.42 ms`\n</details>")
    assert claim_problems(nb) == []                   # a solution's arithmetic cites nothing
    nb.cells.append(nb.cells[0])
    assert claim_problems(nb) == ["the tag out:step is on several code cells"]


# ------------------------------------------------------------- answers printed above their question
# An exercise asks before it tells: no output above ``### Exercise N`` may print its answer. The
# answer is what the folded solution's code assigns; its unit is the stub's comment ("# seconds").

EXERCISE = re.compile(r"^### Exercise (\d+) · ", re.MULTILINE)
SOLUTION_CODE = re.compile(r"```python\n(.*?)```", re.DOTALL)
SCALES = {"seconds": {"s": 1.0, "ms": 1e3, "µs": 1e6}, "ms": {"ms": 1.0, "s": 1e-3, "µs": 1e3},
          "bytes": {"B": 1.0, "kB": 1e-3, "MB": 1e-6, "KiB": 2**-10, "MiB": 2**-20}}


def _unit_of(stub: str) -> str | None:
    comment = stub.split("#", 1)[1] if "#" in stub else ""
    return next((u for u in SCALES if re.search(rf"\b{u}\b", comment)), None)


def leaks(nb) -> list[str]:
    """Exercises whose numeric answer (computed, not a bare literal) a code cell above prints."""
    found = []
    for i, cell in enumerate(nb.cells):
        m = EXERCISE.search(cell.source) if cell.cell_type == "markdown" else None
        if not m or i + 3 >= len(nb.cells) or nb.cells[i + 1].cell_type != "code":
            continue
        stub, fold = nb.cells[i + 1].source, nb.cells[i + 3].source
        code = SOLUTION_CODE.search(fold)
        unit = _unit_of(stub)
        if not code or unit is None:
            continue
        names = {}
        exec(code.group(1), {}, names)                       # the solution: plain arithmetic
        value = next(v for v in names.values() if isinstance(v, (int, float)))
        above = "".join(o.get("text", "") for c in nb.cells[:i] if c.cell_type == "code"
                        for o in c.get("outputs", []) if o.get("output_type") == "stream")
        for p in PRINTED.finditer(above):
            number, printed_unit = p.group("number"), _unit(p.group("unit"))
            decimals = len(number.split(".")[1]) if "." in number else 0
            scale = SCALES[unit].get(printed_unit)
            if scale is not None and abs(round(value * scale, decimals) - abs(float(number))) < 1e-9:
                found.append(f"Exercise {m.group(1)}: its answer {value:g} ({unit}) is printed above "
                             f"it as {number} {printed_unit}")
    return found


@pytest.mark.parametrize("name", CITING)
def test_no_output_above_an_exercise_prints_its_answer(name):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    assert len(EXERCISE.findall(" ".join(c.source for c in nb.cells))) >= 3
    assert not leaks(nb), f"{name}: " + "; ".join(leaks(nb))


def test_an_answer_printed_above_its_exercise_is_caught():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    printed = code("print(...)")
    printed.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                              text="p=4: predicted T = 344.57 ms, time_scale >= 200\n")]
    nb = nbformat.v4.new_notebook()
    nb.cells = [printed, md("### Exercise 1 · A ring\n\nHow long?"), code("answer_1 = ...   # seconds"),
                code("check_1(answer_1)"),
                md("<details><summary>Solution</summary>\n\n```python\nanswer_1 = 6 * 5e-3 + 1.5 * 2**21 / 10e6\n"
                   "```\n</details>")]
    assert leaks(nb) == ["Exercise 1: its answer 0.344573 (seconds) is printed above it as 344.57 ms"]
    nb.cells[4].source = nb.cells[4].source.replace("2**21", "2**22")      # another answer: no leak
    assert leaks(nb) == []
