"""The package's house rules, read from the source (AST), not from a running import:

* no import circle anywhere in ``mtb_helpers`` (a circle is named, module by module), counting
  imports inside functions, imports by name (``importlib.import_module("...")``, the manifest's
  entries), module-level tables of lazily imported modules, and the package ``__init__`` an
  import runs first; the circles still there are listed once, with what removes each;
* data flows one way: nothing under ``runtime/`` or ``comm/``, and no topic's layers, imports a
  check, a plot, a widget or the command line; plots import no check;
* every module stays under 300 lines;
* every topic folder has the files a newcomer expects to find there.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from mtb_helpers import topics as manifest

PACKAGE = Path(__file__).resolve().parents[1] / "mtb_helpers"
MAX_LINES = 300
UPPER = ("check", "checking", "plots", "widget", "widgets", "cli")
# below the topics: these import no topic (the manifest finds the topics, from the top)
LOWER = ("mtb_helpers.runtime", "mtb_helpers.comm", "mtb_helpers.checking", "mtb_helpers.plots",
         "mtb_helpers.widgets")


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(topics=None) -> dict[str, Path]:
    """{module name: file} of mtb_helpers and of every topic package the manifest names that
    lives elsewhere."""
    found = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    for topic in manifest.listed(topics):
        if topic.package.split(".")[0] != "mtb_helpers":
            folder = Path(next(iter(importlib.util.find_spec(topic.package)
                                    .submodule_search_locations)))
            root = folder.parents[len(topic.package.split(".")) - 1]
            found.update({module_name(p, root): p for p in sorted(folder.rglob("*.py"))})
    return found


def _import_module_literal(node: ast.AST) -> str | None:
    """``"a.b"`` of a call ``importlib.import_module("a.b")`` (or ``import_module("a.b")``)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return node.args[0].value if called == "import_module" else None


def _lazy_table_entries(tree: ast.Module) -> set[str]:
    """The strings of a module-level table a module imports from lazily (PEP 562's
    ``{name: "mtb_helpers.x.y"}``): the values of every module-level dict."""
    found = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict):
            found |= {v.value for v in value.values
                      if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found


def _packages_run_first(name: str, imported: str, modules: dict[str, Path]) -> set[str]:
    """The packages whose ``__init__`` importing ``imported`` runs first (``a.b`` for ``a.b.c``),
    leaving out the package root (its names load lazily) and ``name``'s own packages (they are
    already running when ``name`` imports)."""
    parts = imported.split(".")
    parents = {".".join(parts[:i]) for i in range(2, len(parts))}
    return {p for p in parents if modules.get(p, Path()).name == "__init__.py"
            and not (name + ".").startswith(p + ".")}


def imports_of(name: str, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports: at module level or inside functions (a lazy import
    is still a dependency), by name (``importlib.import_module("...")`` and a module-level table
    of lazily imported modules), and the packages whose ``__init__`` such an import runs first.
    ``from pkg import sub`` counts as importing ``pkg.sub``."""
    path = modules[name]
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    found = set(_lazy_table_entries(tree))
    for node in ast.walk(tree):
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
                found.add(sub if sub in modules else base)
        elif (literal := _import_module_literal(node)) is not None:
            found.add(literal)
    found = {m for m in found if m in modules}
    for imported in list(found):
        found |= _packages_run_first(name, imported, modules)
    return {m for m in found if m != name}


def import_graph(topics=None) -> dict[str, set[str]]:
    """Every module's imports, plus the manifest's own: topics.py imports each topic's bug, check
    and cli modules by name (importlib), which the AST alone would not show."""
    modules = package_modules(topics)
    graph = {name: imports_of(name, modules) for name in modules}
    for topic in manifest.listed(topics):
        named = [*topic.bugs, "cli", *{c.rpartition(".")[0] or "check" for c in topic.checks}]
        graph["mtb_helpers.topics"] |= {f"{topic.package}.{m}" for m in named} & set(modules)
    return graph


def layer_modules(topics=None) -> list[str]:
    """runtime/, comm/ and every topic's layer modules, as the manifest names them."""
    modules = package_modules(topics)
    names = [n for n in modules if n.startswith(("mtb_helpers.runtime", "mtb_helpers.comm"))]
    for topic in manifest.listed(topics):
        names += [f"{topic.package}.{m}" for m in topic.layers if f"{topic.package}.{m}" in modules]
    return names


def _is_upper(module: str) -> bool:
    if module in ("mtb_helpers.checking.bug", "mtb_helpers.checking"):
        return False   # the Bug shape and registry (and checking/__init__, which imports nothing,
        #                run first): an entry point at the layers (pipeline_step) resolves there
    parts = module.split(".")
    return any(p in UPPER for p in parts[1:]) or module in ("mtb_helpers.check", "mtb_helpers.topics")


def upward_imports(name: str, graph: dict[str, set[str]]) -> list[str]:
    """What layer module ``name`` imports from above it (checks, plots, widgets, the CLI)."""
    return sorted(m for m in graph[name] if _is_upper(m))


def topic_imports(name: str, graph: dict[str, set[str]], topics=None) -> list[str]:
    """The topic modules, the manifest or the package root (which reads it) ``name`` imports."""
    packages = tuple(t.package for t in manifest.listed(topics))
    top = ("mtb_helpers", "mtb_helpers.topics", "mtb_helpers.check")
    return sorted(m for m in graph[name] if m in top + packages
                  or m.startswith(tuple(p + "." for p in packages)))


MODULES = package_modules()
GRAPH = import_graph()


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
    cycle = find_cycle(GRAPH)   # lazy imports and imports by name included
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_imports_by_name_lazy_tables_and_packages_run_first_are_edges(tmp_path):
    pkg = tmp_path / "lazy"
    for path, text in {"__init__.py": "",
                       "low/__init__.py": "import importlib\n\n\ndef f():\n"
                                          "    return importlib.import_module('lazy.high.mod')\n",
                       "low/mod.py": "",
                       "high/__init__.py": "_TABLE = {'Name': 'lazy.low.mod'}\n",
                       "high/mod.py": "from lazy.low.mod import *  # noqa\n"}.items():
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text(text)
    modules = {module_name(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    assert imports_of("lazy.low", modules) == {"lazy.high.mod", "lazy.high"}   # by name + its package
    assert imports_of("lazy.high", modules) == {"lazy.low.mod", "lazy.low"}    # the lazy table
    assert imports_of("lazy.high.mod", modules) == {"lazy.low.mod", "lazy.low"}
    graph = {name: imports_of(name, modules) for name in modules}
    assert find_cycle(graph) is not None   # low -> high.mod -> low: the circle the AST alone missed


@pytest.mark.parametrize("name", layer_modules())
def test_runtime_comm_and_layers_import_no_check_plot_widget_or_cli(name):
    upward = upward_imports(name, GRAPH)
    assert not upward, f"{name} imports {upward}: data flows runtime -> comm -> layers -> checks"


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith(LOWER)])
def test_nothing_below_the_topics_imports_a_topic(name):
    found = topic_imports(name, GRAPH)
    assert not found, f"{name} imports {found}: only the top of the package knows the topics"


@pytest.mark.parametrize("name", [n for n in MODULES if n.endswith(".plots") or ".plots." in n])
def test_plots_import_no_check(name):
    checks = sorted(m for m in GRAPH[name] if m.endswith(".check") or ".checking" in m)
    assert not checks, f"{name} imports {checks}: a plot draws plain data"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_short(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(PACKAGE.parent)} has {lines} lines"


@pytest.mark.parametrize("topic", manifest.TOPICS, ids=lambda t: t.name)
def test_every_topic_folder_has_the_files_its_manifest_line_names(topic):
    have = {n.rpartition(".")[2] for n in MODULES if n.startswith(topic.package + ".")}
    checks = {c.rpartition(".")[0] or "check" for c in topic.checks}
    expected = {"cli", *checks, *topic.bugs, *topic.layers}
    missing = expected - have
    assert not missing, f"{topic.package} lacks {sorted(missing)}"


STABLE_IMPORTS = {   # DESIGN.md's stable entry points and issue 10's "keep working" list
    "mtb_helpers": "run warm_up shutdown seed_all RankError RankTimeoutError BUGS",
    "mtb_helpers.tp": "ColumnParallelLinear RowParallelLinear ParallelMLP shard_range "
                      "ParallelSelfAttention VocabParallelEmbedding vocab_parallel_cross_entropy",
    "mtb_helpers.sp": "SequenceParallelMLPBlock",
    "mtb_helpers.plan": "model_state_bytes activation_bytes_per_layer plan",
    "mtb_helpers.pp": "schedule simulate pipeline_step",
    "mtb_helpers.cp": "shard_sequence unshard_sequence ring_attention allgather_attention",
    "mtb_helpers.check": "check_column_parallel check_row_parallel check_tp_mlp "
                         "check_sequence_parallel check_data_parallel check_moe check_grid "
                         "check_collectives check_pipeline check_tp_attention "
                         "check_vocab_parallel check_context_parallel check_capstone",
    "mtb_helpers.cost": "Link predict calibrate padded",
    "mtb_helpers.comm": "record copy_to_tensor_model_parallel_region "
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


THROWAWAY = {   # a topic folder outside the package: what a new topic needs, and no more
    "__init__.py": '"""A throwaway topic."""\nfrom mtb_toy import bugs, more_bugs  # noqa: F401\n',
    "layers.py": '"""Its layer."""\n\n\ndef double(x):\n    return 2 * x\n',
    "bugs.py": '"""Its first bug module."""\nfrom mtb_helpers.checking.bug import Bug, register\n\n'
               'BUGS = {"toy-triple": Bug("toy: triples instead of doubling", checks=("toy",))}\n'
               'register("toy", BUGS)\n',
    "more_bugs.py": '"""Its second bug module."""\nfrom mtb_helpers.checking.bug import Bug, register\n\n'
                    'BUGS = {"toy-halve": Bug("toy: halves", checks=("toy",))}\nregister("toy", BUGS)\n',
    "check.py": '"""Its check."""\nfrom mtb_helpers.checking.bug import resolve\n'
                '\n\ndef check_toy(bug=None):\n'
                '    return resolve(bug, "toy")\n',
    "cli.py": '"""Its command."""\n\n\ndef register(top, groups):\n'
              '    groups["toy"].add_parser("check").set_defaults(func=lambda args: 0)\n',
    "plots.py": '"""Its figures."""\n',
    "widget.py": '"""Its explorer."""\n',
}


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """mtb_toy, written to a temporary folder and added to the manifest by one line (bug names
    registered by it are forgotten afterwards)."""
    from mtb_helpers.checking import bug

    folder = tmp_path / "mtb_toy"
    folder.mkdir()
    for name, text in THROWAWAY.items():
        (folder / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(bug, "_OWNERS", dict(bug._OWNERS))
    monkeypatch.setattr(bug, "_REGISTRY", dict(bug._REGISTRY))
    toy = manifest.Topic("toy", package="mtb_toy", group="toy", group_help="a throwaway topic",
                         checks=("check_toy",), bugs=("bugs", "more_bugs"))
    monkeypatch.setattr(manifest, "TOPICS", manifest.TOPICS + (toy,))   # the one line
    yield folder
    import sys
    for name in [n for n in sys.modules if n == "mtb_toy" or n.startswith("mtb_toy.")]:
        del sys.modules[name]


def test_a_throwaway_topic_needs_one_manifest_line(throwaway):
    from mtb_helpers.cli import build_parser

    parser = build_parser()                                             # the CLI
    assert "a throwaway topic" in parser.format_help()
    assert parser.parse_args(["toy", "check"]).func(None) == 0
    check_toy = manifest.check_functions()["check_toy"]                 # mtb_helpers.check's source
    assert check_toy("toy-triple").description.startswith("toy")        # its package registered it
    assert {"toy-triple", "toy-halve"} <= set(manifest.bug_registry())  # the bug list, both modules
    with pytest.raises(ValueError, match="does not apply"):
        check_toy("f-backward-identity")
    assert "mtb_toy.layers" in layer_modules()                           # the layering check
    graph = import_graph()
    assert not upward_imports("mtb_toy.layers", graph) and find_cycle(graph) is None
    (throwaway / "layers.py").write_text("from mtb_toy.check import check_toy\n")
    assert upward_imports("mtb_toy.layers", import_graph()) == ["mtb_toy.check"]


def test_a_bug_name_two_topics_declare_is_refused_naming_both(throwaway):
    (throwaway / "more_bugs.py").write_text(
        "from mtb_helpers.checking.bug import Bug, register\n"
        "BUGS = {'f-backward-identity': Bug('toy: the same name as a tp bug', checks=('toy',))}\n"
        "register('toy', BUGS)\n")
    with pytest.raises(ValueError, match="'f-backward-identity' is declared by two topics, 'tp' "
                                         "and 'toy'"):
        manifest.bug_registry()


def test_a_topic_with_no_bugs_needs_no_bug_module(throwaway, monkeypatch):
    (throwaway / "bugs.py").unlink()
    (throwaway / "more_bugs.py").unlink()
    (throwaway / "__init__.py").write_text('"""A throwaway topic."""\n')
    (throwaway / "check.py").write_text("def check_toy():\n    return 'ok'\n")
    quiet = manifest.Topic("toy", package="mtb_toy", checks=("check_toy",), bugs=())
    monkeypatch.setattr(manifest, "TOPICS", manifest.TOPICS[:-1] + (quiet,))
    assert manifest.check_functions()["check_toy"]() == "ok"
    assert not any(n.startswith("toy") for n in manifest.bug_registry())
    assert "mtb_toy.layers" in layer_modules()
