"""The explorers on ipywidgets 7.7, the version Colab ships (JupyterLab and Binder have 8).

ipywidgets 7.7.1 (Colab's pin) is pip-installed once into a cached folder under the temporary
directory and put first on PYTHONPATH of a fresh Python process. There, under an IPython shell
with the inline matplotlib backend (what a Colab kernel has), every explorer builder is built and
each of its controls is moved and moved back while what it shows is read (the displayed output,
and the text and image widgets the shared frame updates in place): nothing may raise, every move
must show something, and some move must redraw both the figure and the text.

Builders are discovered, not listed: every public function of a ``mtb_helpers/<topic>/widget.py``
module whose return annotation is an ipywidgets widget, called with its defaults.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLAB_IPYWIDGETS = "7.7.1"
# Every topic folder's explorer module (mtb_helpers/<topic>/widget.py).
WIDGET_MODULES = sorted(f"mtb_helpers.{p.parent.name}.widget"
                        for p in (ROOT / "mtb_helpers").glob("*/widget.py"))

# Runs in the child process: argv = result file, module names.
HARNESS = textwrap.dedent(r'''
    import importlib, inspect, json, re, sys, traceback, typing
    import ipywidgets
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.enable_gui = lambda gui=None: None   # a bare shell has no GUI loop; inline needs none
    shell.run_line_magic("matplotlib", "inline")
    CLEAR = re.compile(r"\x1b\[2K\r")

    def builders(module):
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in names:
            fn = getattr(module, name)
            if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            ret = typing.get_type_hints(fn).get("return")
            if isinstance(ret, type) and issubclass(ret, ipywidgets.Widget):
                yield name, fn

    def controls(widget):
        kinds = (ipywidgets.IntSlider, ipywidgets.FloatSlider, ipywidgets.Dropdown,
                 ipywidgets.Checkbox, ipywidgets.ToggleButtons, ipywidgets.RadioButtons,
                 ipywidgets.SelectionSlider, ipywidgets.BoundedIntText, ipywidgets.BoundedFloatText)
        if isinstance(widget, kinds):
            yield widget
        for child in getattr(widget, "children", ()):
            yield from controls(child)

    def moved(control):
        """Set another valid value; return a function that puts the old one back."""
        if hasattr(control, "options"):
            old, value = control.index, control.value   # index None: nothing selected yet
            for k in range(1, len(control.options) + 1):  # the next option with another value
                control.index = ((-1 if old is None else old) + k) % len(control.options)
                if control.value != value:
                    break
            return lambda: setattr(control, "index", old)
        old = control.value
        if isinstance(control, ipywidgets.Checkbox):
            control.value = not old
        else:
            step = getattr(control, "step", 1) or 1
            control.value = old + step if old + step <= control.max else old - step
        return lambda: setattr(control, "value", old)

    def state(widget):
        """What the explorer itself shows: its HTML widgets' text and its Image widgets' PNGs
        (the shared frame updates them in place instead of displaying new outputs)."""
        texts, images = [], []
        if isinstance(widget, ipywidgets.Image):
            images.append(bytes(widget.value))
        elif isinstance(widget, ipywidgets.HTML):
            texts.append(widget.value)
        for child in getattr(widget, "children", ()):
            more = state(child)
            texts += more[0]
            images += more[1]
        return texts, images

    def shown(action, root):
        with capture_output() as cap:
            action()
        images = [o.data["image/png"] for o in cap.outputs if "image/png" in o.data]
        html = [o.data["text/html"] for o in cap.outputs if "text/html" in o.data]
        texts, pngs = state(root)
        return {"text": CLEAR.sub("", cap.stdout) + "".join(html) + "".join(texts),
                "stderr": cap.stderr, "images": images + pngs}

    result = {"version": ipywidgets.__version__, "explorers": []}
    for module_name in sys.argv[2:]:
        module = importlib.import_module(module_name)
        for name, build in builders(module):
            entry = {"name": f"{module_name}.{name}", "moves": []}
            result["explorers"].append(entry)
            try:
                with capture_output():
                    widget = build()
                entry["type"] = type(widget).__name__
                for control in controls(widget):
                    undo = []
                    there = shown(lambda: undo.append(moved(control)), widget)
                    back = shown(undo[0], widget)
                    entry["moves"].append({
                        "control": f"{type(control).__name__} {control.description!r}",
                        "there": there, "back": back,
                        "text_changed": there["text"] != back["text"],
                        "figure_changed": bool(there["images"]) and bool(back["images"])
                                          and there["images"] != back["images"]})
            except Exception:
                entry["error"] = traceback.format_exc()
    for e in result["explorers"]:   # images are only compared here, not sent back
        for m in e["moves"]:
            for side in ("there", "back"):
                m[side]["images"] = len(m[side]["images"])
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
''')


def _install(version: str) -> Path:
    """ipywidgets ``version`` in a cached --target folder, reused across test sessions.

    --no-deps on purpose: of 7.7's requirements, ipykernel/IPython/traitlets come from this
    environment, ipython_genutils is the one pure-Python module 7.x imports that 8 dropped, and
    widgetsnbextension / jupyterlab_widgets are front-end halves the kernel side never imports.
    """
    target = Path(tempfile.gettempdir()) / (
        f"mtb-ipywidgets-{version}-py{sys.version_info.major}{sys.version_info.minor}")
    if (target / "ipywidgets").is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".staging-"))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--target", str(staging), f"ipywidgets=={version}",
           "ipython_genutils==0.2.0"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"could not install ipywidgets {version} from PyPI (this test needs the "
                    f"registry once, then caches it in {target}):\n{proc.stderr[-2000:]}")
    try:
        staging.rename(target)      # atomic: a parallel session either wins or finds it done
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _run_harness(tmp_path: Path, site: Path | None, modules: list[str],
                 extra_path: Path | None = None) -> dict:
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    out = tmp_path / "result.json"
    path = [str(p) for p in (site, extra_path) if p] + [str(ROOT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), MPLBACKEND="agg")
    proc = subprocess.run([sys.executable, str(script), str(out), *modules], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0 and out.exists(), \
        f"the harness failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def _problems(explorer: dict) -> list[str]:
    name = explorer["name"]
    if "error" in explorer:
        return [f"{name} raised:\n{explorer['error']}"]
    problems = []
    if not explorer["moves"]:
        problems.append(f"{name}: no slider, dropdown or checkbox found")
    for move in explorer["moves"]:
        for side in ("there", "back"):
            shown = move[side]
            if "Traceback" in shown["text"] + shown["stderr"]:
                problems.append(f"{name}: moving {move['control']} ({side}) raised:\n"
                                f"{(shown['text'] + shown['stderr'])[-1500:]}")
            elif not (shown["text"].strip() or shown["images"]):
                problems.append(f"{name}: moving {move['control']} ({side}) showed nothing")
    if not any(m["text_changed"] and m["figure_changed"] for m in explorer["moves"]):
        problems.append(f"{name}: no control redrew both the figure and the text: "
                        + "; ".join(f"{m['control']}: text {m['text_changed']}, figure "
                                    f"{m['figure_changed']}" for m in explorer["moves"]))
    return problems


@pytest.fixture(scope="module")
def ipywidgets77() -> Path:
    return _install(COLAB_IPYWIDGETS)


@pytest.fixture(scope="module")
def on_77(ipywidgets77, tmp_path_factory) -> dict:
    """Every widgets module in one child process (torch is imported once)."""
    return _run_harness(tmp_path_factory.mktemp("ipywidgets77"), ipywidgets77,
                        WIDGET_MODULES)


def test_widget_modules_exist():
    assert len(WIDGET_MODULES) >= 9, f"explorer modules found: {WIDGET_MODULES}"


def test_the_child_runs_ipywidgets_7_7(on_77):
    assert on_77["version"].startswith("7.7"), f"ran with ipywidgets {on_77['version']}"


@pytest.mark.parametrize("module", WIDGET_MODULES)
def test_explorers_work_on_ipywidgets_7_7(on_77, module):
    explorers = [e for e in on_77["explorers"] if e["name"].startswith(module + ".")]
    assert explorers, (f"{module} has no explorer builder: a public "
                       f"function annotated to return an ipywidgets widget")
    problems = [p for e in explorers for p in _problems(e)]
    assert not problems, "\n\n".join(problems)


def test_the_harness_catches_an_ipywidgets_8_only_explorer(ipywidgets77, tmp_path):
    """widgets.Stack exists only in ipywidgets 8: an explorer using it must fail here."""
    fake = tmp_path / "fake_pkg"
    fake.mkdir()
    (fake / "eight_only.py").write_text(textwrap.dedent('''
        import ipywidgets as widgets

        def stacked() -> widgets.Box:
            return widgets.Stack([widgets.IntSlider(), widgets.Output()], selected_index=0)
    '''))
    result = _run_harness(tmp_path, ipywidgets77, ["eight_only"], extra_path=fake)
    [explorer] = result["explorers"]
    assert "Stack" in explorer.get("error", ""), explorer
    assert _problems(explorer)
