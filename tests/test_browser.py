"""Every notebook in a real browser: JupyterLab 4 on loopback, driven by headless Chromium.

For each ``notebooks/*.ipynb`` (a temporary copy, so nothing here is written back): open it, clear
the saved outputs, Run > Run All Cells, wait for the kernel to go idle, then check what a student
would see: every code cell ran, no traceback (stderr only as ranks' tagged lines), every widget
cell shows a live widget (never "Error displaying widget"), and in the explorers named in
SLIDER_NOTEBOOKS a slider moved with the keyboard redraws the figure and the printed summary.
A full-height screenshot per notebook goes to test-artifacts/browser/<name>.png.

One JupyterLab server serves the whole module; each notebook gets its own workspace and browser
context, and its kernel (and with it its ranks) is shut down before the next one opens.

The kernel is always this Python. The front end is this Python's JupyterLab, unless MTB_LAB_PYTHON
names another Python whose ``jupyter lab`` serves the page: CI's Colab leg does that, because an
ipywidgets 7 kernel needs an ipywidgets 7 front end (JupyterLab 3 with jupyterlab_widgets 1.x;
jupyterlab_widgets 3 in JupyterLab 4 refuses 7's widget models), as Colab's own front end is one.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest

from tests.procs import wait_dead

ROOT = Path(__file__).resolve().parents[1]
# every English notebook, and one of the Chinese edition (notebooks/zh: the same code, translated text)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + [ROOT / "notebooks" / "zh" / "05_pipeline_bubble.ipynb"]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# notebooks whose explorer must redraw figure and summary when a slider moves
SLIDER_NOTEBOOKS = {"03_tp_mlp", "05_pipeline_bubble"}
RUN_ALL_TIMEOUT_MS = 420_000
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
# what scrolls the notebook: in JupyterLab 4, else (JupyterLab 3) the notebook itself
SCROLLER = ("(document.querySelector(panel + ' .jp-WindowedPanel-outer')"
            " ?? document.querySelector(panel + ' .jp-NotebookPanel-notebook'))")
RANK_LINE = re.compile(r"^\[rank \d+\]")
MAX_SCREENSHOT_HEIGHT = 60_000  # px; the longest notebook is about 30 000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(user_settings: Path) -> None:
    """No news/update toasts over the screenshots, and no requests leaving the machine."""
    notif = user_settings / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def _api(base: str, path: str, method: str = "GET"):
    with urllib.request.urlopen(urllib.request.Request(base + path, method=method),
                                timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


def _kernelspec(jupyter_path: Path) -> None:
    """The default kernel ("python3") runs this Python, whichever Python serves JupyterLab."""
    spec = jupyter_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free loopback port serving a copy of notebooks/; yields its URL.
    Finalizer: stop the server, then any kernel or rank it left, and check none survived."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "course"
    shutil.copytree(ROOT / "notebooks", root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    _settings(tmp / "settings")
    port = _free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
    lab_python = os.environ.get("MTB_LAB_PYTHON") or sys.executable
    if lab_python != sys.executable:  # another Python's front end, this Python's kernel
        _kernelspec(tmp / "kernels-path")
        env["JUPYTER_PATH"] = str(tmp / "kernels-path")
    log = open(tmp / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [lab_python, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.allow_root=True",
         "--ServerApp.disable_check_xsrf=True",
         f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={tmp / 'settings'}",
         f"--LabApp.workspaces_dir={tmp / 'workspaces'}"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n"
                            + (tmp / "jupyterlab.log").read_text()[-3000:])
            try:
                _api(base, "/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not answer within 90 s:\n"
                                + (tmp / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.3)
        yield {"base": base, "server": server, "seen": seen, "log": tmp / "jupyterlab.log"}
    finally:
        _stop(server, seen)
        log.close()


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _stop(server: subprocess.Popen, seen: set[int]) -> None:
    """Stop JupyterLab, its kernels and their ranks; fail if any of them outlives the stop."""
    # Record the whole tree first: once the server dies, its kernels are re-parented and lost.
    seen |= _descendants(server.pid)
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)  # jupyter_server shuts its kernels down, then exits
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    for pid in seen:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    assert wait_dead([server.pid, *seen], within=15), \
        "JupyterLab, a kernel or a rank survived the end of the browser test"


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's Chromium. Install "
                    f"it with: sudo apt-get update && sudo apt-get install -y chromium "
                    f"(.ci/run does this in CI)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _menu(page, top: str, *items: str) -> None:
    """Click menu ``top``, then the first of ``items`` it shows (JupyterLab 3 and 4 name some
    items differently)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(top)}$")).click()
    names = "|".join(re.escape(i) for i in items)
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^({names})$")).first.click()


def _wait_kernel_ready(page, name: str, timeout_s: float = 120) -> None:
    """Until the status bar says the notebook's kernel is idle. JupyterLab sometimes asks which
    kernel to start although the notebook names one; accept its default as a student would."""
    status = page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$"))
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if dialog.count():
            dialog.locator(".jp-mod-accept").click()
        elif status.count():
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"{name}: the kernel did not become idle within {timeout_s:.0f} s; "
                         f"status bar: {page.locator('#jp-main-statusbar').inner_text()!r}")


def _wait_run_all(page, timeout_ms: int) -> None:
    """Done when the kernel is idle, nothing is queued ([*]) and the first code cell has run."""
    page.wait_for_function(
        """(panel) => {
          const root = document.querySelector(panel);
          if (!root) return false;
          const prompts = [...root.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
                          .map(e => e.textContent.trim());
          const status = root.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status');
          return status === 'idle' && prompts.length > 0 && !prompts.some(t => t.includes('*'))
                 && /\\d/.test(prompts[0]);
        }""", arg=PANEL, timeout=timeout_ms, polling=500)


def _code_cell_report(page) -> list[dict]:
    """Per code cell in the DOM: its prompt, first source line, widget views and bad outputs."""
    return page.evaluate(
        """(panel) => [...document.querySelector(panel).querySelectorAll('.jp-CodeCell')].map(cell => {
          // textContent, not innerText: content-visibility leaves off-screen cells unrendered,
          // and innerText of an unrendered element is empty
          const hidden = cell.querySelector('.jp-InputPlaceholder') !== null;  // folded source
          const prompt = cell.querySelector('.jp-InputArea-prompt')?.textContent.trim() ?? '';
          const first = (hidden ? cell.querySelector('.jp-PlaceholderText')?.textContent
                                : cell.querySelector('.cm-content .cm-line, .CodeMirror-line')?.textContent) ?? '';
          const stderr = [...cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                          .map(e => e.textContent);
          const outputs = cell.querySelector('.jp-Cell-outputArea');
          return {prompt, first, stderr, hidden,
                  widgets: cell.querySelectorAll('.jp-Cell-outputArea .jupyter-widgets').length,
                  text: outputs ? outputs.textContent : ''};
        })""", PANEL)


def _saved_widget_cells(path: Path) -> list[int]:
    """Indices (among code cells) of the cells whose saved outputs include a widget view."""
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return [i for i, c in enumerate(cells)
            if any(WIDGET_MIME in o.get("data", {}) for o in c.get("outputs", []))]


def _not_rank_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not RANK_LINE.match(line)]


def _screenshot(page, name: str) -> None:
    """The whole notebook, not only the viewport: grow the window to the notebook's height.

    Off-screen cells are laid out at an estimated height (content-visibility) until they come into
    view, so grow, let them render, measure again, until the last cell fits."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    page.evaluate(f"(panel) => {SCROLLER}?.scrollTo(0, 0)", PANEL)
    height = size["height"]
    for _ in range(6):
        extra = page.evaluate(
            """(panel) => {
              const s = {SCROLLER};
              const cells = document.querySelectorAll(panel + ' .jp-Cell');
              if (!s || !cells.length) return 0;
              // up to the last cell, not the scroll-past-end padding below it
              const bottom = cells[cells.length - 1].getBoundingClientRect().bottom
                             - s.getBoundingClientRect().top + s.scrollTop;
              return Math.ceil(bottom + 24 - s.clientHeight);
            }""".replace("{SCROLLER}", SCROLLER), PANEL)
        if extra <= 0 or height >= MAX_SCREENSHOT_HEIGHT:
            break
        height = min(height + extra, MAX_SCREENSHOT_HEIGHT)
        page.set_viewport_size({"width": size["width"], "height": height})
        page.wait_for_timeout(400)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


# The shared explorer frame (mtb_helpers/widgets/frame.py) shows its figures as Image widgets
# and its texts as HTML widgets, updated in place.
FIGURE = "img.widget-image"
SUMMARY = ".widget-html-content"


def _explorer_state(explorer) -> tuple[str | None, str]:
    img = explorer.locator(FIGURE)
    text = explorer.locator(SUMMARY)
    return (img.first.get_attribute("src") if img.count() else None,
            "\n".join(text.all_text_contents()))


def _move_a_slider(page, name: str) -> None:
    """Press an arrow key on the explorer's first slider; the figure and the summary must change."""
    explorer = page.locator(f"{PANEL} .jp-OutputArea-output").filter(
        has=page.locator(".widget-slider")).filter(has=page.locator(FIGURE)).first
    assert explorer.count(), f"{name}: no explorer with a slider and a figure"
    src0, text0 = _explorer_state(explorer)
    assert src0 and text0.strip(), f"{name}: the explorer shows no figure or no summary text"
    # ipywidgets 8 draws a noUiSlider (with aria values), ipywidgets 7 a jQuery UI slider (without)
    slider = explorer.locator(".widget-slider").first
    handle = slider.locator(".noUi-handle, .ui-slider-handle").first
    readout = slider.locator(".widget-readout").first
    before = readout.inner_text()
    at_max = handle.get_attribute("aria-valuenow") is not None and \
        handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    handle.focus()
    handle.press("ArrowLeft" if at_max else "ArrowRight")
    page.wait_for_timeout(500)
    if readout.inner_text() == before:  # at the right end, with no aria value to have said so
        handle.press("ArrowLeft")
    assert readout.inner_text() != before, f"{name}: the slider's arrow keys did not move it"
    try:
        page.wait_for_function(
            """([el, src0, text0, figure, summary]) => {
              const img = el.querySelector(figure);
              const text = [...el.querySelectorAll(summary)].map(e => e.textContent).join('\\n');
              return img && img.src !== src0 && text.trim() && text !== text0;
            }""", arg=[explorer.element_handle(), src0, text0, FIGURE, SUMMARY], timeout=60_000,
            polling=250)
    except Exception as exc:  # say what did and did not change
        src1, text1 = _explorer_state(explorer)
        raise AssertionError(
            f"{name}: moving the slider did not redraw both outputs (figure changed: "
            f"{src1 != src0}, summary changed: {text1 != text0}); summary now:\n{text1}") from exc


def _shutdown_kernels(base: str) -> None:
    for session in _api(base, "/api/sessions"):
        _api(base, f"/api/sessions/{session['id']}", method="DELETE")


def _name(path: Path) -> str:
    """``05_pipeline_bubble``, or ``zh-05_pipeline_bubble`` for the Chinese edition's copy."""
    return "-".join(path.relative_to(ROOT / "notebooks").with_suffix("").parts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[_name(p) for p in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(lab, browser, path):
    name = _name(path)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    try:
        # a fresh workspace per notebook: nothing restored from the previous one
        page.goto(f"{lab['base']}/lab/workspaces/t-{name}/tree/{path.relative_to(ROOT / 'notebooks').as_posix()}")
        _wait_kernel_ready(page, name)
        page.keyboard.press("Control+b")  # hide the file browser: the screenshot is the notebook
        if name.startswith("zh-"):   # the Chinese edition shows its translated text
            heading = page.locator(f"{PANEL} .jp-RenderedMarkdown h1").first.inner_text()
            assert re.search(r"[\u4e00-\u9fff]", heading), f"{name}: no Chinese in the title {heading!r}"
        _menu(page, "Edit", "Clear Outputs of All Cells", "Clear All Outputs")  # Lab 4, Lab 3
        _menu(page, "Run", "Run All Cells")
        try:
            _wait_run_all(page, RUN_ALL_TIMEOUT_MS)
        finally:
            lab["seen"] |= _descendants(lab["server"].pid)  # kernels and ranks, for the finalizer
        dialogs = page.locator(".jp-Dialog").all_inner_texts()
        assert not dialogs, f"{name}: a dialog blocks the notebook: {dialogs}"
        cells = _code_cell_report(page)

        errors = [f"code cell {i} {c['first']!r}:\n" + "\n".join(bad)[:1500]
                  for i, c in enumerate(cells) for s in c["stderr"]
                  for bad in [_not_rank_lines(s)] if bad]
        assert not errors, f"{name}: error output in the browser:\n" + "\n\n".join(errors)
        # a folded cell shows no prompt; the cells around it show whether Run All got past it
        not_run = [f"code cell {i} {c['first']!r}" for i, c in enumerate(cells)
                   if not c["hidden"] and not re.search(r"\d", c["prompt"])]
        assert not not_run, f"{name}: Run All stopped before {not_run[:3]}"
        broken = [f"code cell {i} {c['first']!r}" for i, c in enumerate(cells)
                  if "Error displaying widget" in c["text"]]
        assert not broken, f"{name}: 'Error displaying widget' in {broken}"

        widget_cells = _saved_widget_cells(path)
        missing = [f"code cell {i} {cells[i]['first']!r}" for i in widget_cells
                   if cells[i]["widgets"] == 0]
        assert not missing, f"{name}: widget cells that render no live widget: {missing}"
        if widget_cells:
            assert page.locator(f"{PANEL} .widget-slider, {PANEL} .widget-dropdown").count(), \
                f"{name}: the explorer shows no slider or dropdown"
        if name in SLIDER_NOTEBOOKS:
            _move_a_slider(page, name)
    finally:
        try:
            _screenshot(page, name)
        finally:
            if page_errors:
                print(f"{name}: JavaScript errors in the page: {page_errors}")
            context.close()
            _shutdown_kernels(lab["base"])


def test_every_slider_notebook_exists():
    """The slider checks are keyed by file name; a renamed notebook must not skip them silently."""
    names = {p.stem for p in NOTEBOOKS}
    assert SLIDER_NOTEBOOKS <= names, f"missing notebooks: {sorted(SLIDER_NOTEBOOKS - names)}"
