"""The package's house rules, read from the source (AST), not from a running import:

* no import circle anywhere in ``mtb_helpers`` (a circle is named, module by module);
* data flows one way: nothing under ``runtime/`` or ``comm/``, and no topic's layers, imports a
  check, a plot, a widget or the command line; plots import no check;
* every module stays under 300 lines;
* every topic folder has the files a newcomer expects to find there.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mtb_helpers"
MAX_LINES = 300
TOPICS = ("collectives", "tp", "sp", "pp", "dp", "moe", "grid", "cp", "capstone")
# The layers of each topic: what a parallel layer (or its ops) is made of.
LAYER_MODULES = {"collectives": ("ops",), "tp": ("layers", "attention", "vocab"),
                 "sp": ("layers",), "pp": ("schedules", "simulator", "runtime", "stage", "p2p"),
                 "dp": ("strategies", "fsdp"), "moe": ("layers",), "grid": ("layers",),
                 "cp": ("sharding", "ring", "allgather", "online", "exchange", "base"),
                 "capstone": ("model", "layers", "grid", "data")}
UPPER = ("check", "checking", "plots", "widget", "widgets", "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The package modules ``name`` imports at module level or inside functions (a lazy import
    is still a dependency). ``from pkg import sub`` counts as importing ``pkg.sub``."""
    path = MODULES[name]
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None. A package's __init__ importing its own
    submodules is how re-exports work and is not a circle unless the submodule comes back."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_the_package():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def _layer_modules() -> list[str]:
    names = [n for n in MODULES if n.startswith(("mtb_helpers.runtime", "mtb_helpers.comm"))]
    for topic, layers in LAYER_MODULES.items():
        names += [f"mtb_helpers.{topic}.{m}" for m in layers if f"mtb_helpers.{topic}.{m}" in MODULES]
    return names


def _is_upper(module: str) -> bool:
    parts = module.split(".")
    return any(p in UPPER for p in parts[1:]) or module == "mtb_helpers.check"


@pytest.mark.parametrize("name", _layer_modules())
def test_runtime_comm_and_layers_import_no_check_plot_widget_or_cli(name):
    upward = sorted(m for m in GRAPH[name] if _is_upper(m))
    assert not upward, f"{name} imports {upward}: data flows runtime -> comm -> layers -> checks"


@pytest.mark.parametrize("name", [n for n in MODULES if n.endswith(".plots") or ".plots." in n])
def test_plots_import_no_check(name):
    checks = sorted(m for m in GRAPH[name] if m.endswith(".check") or ".checking" in m)
    assert not checks, f"{name} imports {checks}: a plot draws plain data"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_short(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(PACKAGE.parent)} has {lines} lines"


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_folder_has_the_same_files(topic):
    have = {p.stem for p in (PACKAGE / topic).glob("*.py")}
    expected = {"__init__", "plots", "widget", "cli", "bugs", "check"}
    missing = expected - have
    assert not missing, f"mtb_helpers/{topic}/ lacks {sorted(missing)}"


def test_contributing_lists_every_package_file():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "package_map", PACKAGE.parent / "scripts" / "package_map.py")
    package_map = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package_map)
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    missing = package_map.unlisted(text)
    assert not missing, f"CONTRIBUTING.md does not list {missing}: run scripts/package_map.py"
    assert package_map.unlisted("") , "the check cannot fail"


STABLE_IMPORTS = {   # DESIGN.md's stable entry points and issue 10's "keep working" list
    "mtb_helpers": "run warm_up shutdown seed_all RankError RankTimeoutError BUGS",
    "mtb_helpers.tp": "ColumnParallelLinear RowParallelLinear ParallelMLP shard_range "
                      "ParallelSelfAttention VocabParallelEmbedding vocab_parallel_cross_entropy",
    "mtb_helpers.sp": "SequenceParallelMLPBlock",
    "mtb_helpers.pp": "schedule simulate pipeline_step",
    "mtb_helpers.cp": "shard_sequence unshard_sequence ring_attention allgather_attention",
    "mtb_helpers.check": "check_column_parallel check_row_parallel check_tp_mlp "
                         "check_sequence_parallel check_data_parallel check_moe check_grid "
                         "check_collectives check_pipeline check_tp_attention "
                         "check_vocab_parallel check_context_parallel check_capstone",
    "mtb_helpers.comm": "record issue copy_to_tensor_model_parallel_region "
                        "reduce_from_tensor_model_parallel_region "
                        "gather_from_tensor_model_parallel_region "
                        "scatter_to_tensor_model_parallel_region "
                        "gather_from_sequence_parallel_region "
                        "reduce_scatter_to_sequence_parallel_region",
}


@pytest.mark.parametrize("module", sorted(STABLE_IMPORTS))
def test_the_stable_import_paths_still_work(module):
    import importlib

    loaded = importlib.import_module(module)
    missing = [n for n in STABLE_IMPORTS[module].split() if not hasattr(loaded, n)]
    assert not missing, f"from {module} import {', '.join(missing)} no longer works"
    if module == "mtb_helpers.check":
        assert set(STABLE_IMPORTS[module].split()) <= set(loaded.__all__)
