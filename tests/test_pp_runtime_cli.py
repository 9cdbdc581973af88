"""``minitrainbench pp run``: the check table and the measured vs simulated bubble, --json,
--plot, exit 0 pass / 1 a check failed or the step hung / 2 bad arguments, and under torchrun."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mtb_helpers.cli import main


def test_run_passes_and_prints_table_bubble_and_stash(capsys):
    assert main(["pp", "run", "--stages", "3", "--microbatches", "6", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "pipeline [" in out and "PASSED" in out and "0.weight.grad" in out
    assert "ops executed = schedule(): yes" in out
    assert "bubble fraction   measured" in out and "simulated 0.250" in out   # (p-1)/(m+p-1)
    assert "peak stashed      measured [3, 2, 1]   simulated [3, 2, 1]" in out


def test_run_json_and_plot(tmp_path, capsys):
    png = tmp_path / "gantt.png"
    assert main(["pp", "run", "--schedule", "interleaved", "--stages", "2", "--microbatches", "4",
                 "--op-time", "0.002,0.004", "--recompute", "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    check = data["checks"][0]
    assert data["passed"] and check["config"]["chunks"] == 2 and check["config"]["recompute"]
    assert check["pipeline"]["peak_stashed"] == check["pipeline"]["simulated_peak_activations"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("bug", ["pp-loss-not-scaled", "pp-wrong-stash"])
def test_a_bug_exits_1(bug, capsys):
    assert main(["pp", "run", "--stages", "3", "--microbatches", "4", "--bug", bug]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_a_deadlock_exits_1_naming_the_blocked_sends(capsys):
    assert main(["pp", "run", "--stages", "2", "--microbatches", "2", "--bug", "pp-blocking-send",
                 "--timeout", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: the pipeline step hung" in out and "blocked in the send" in out


@pytest.mark.parametrize("argv,message", [
    (["--op-time", "0.1"], "--op-time 0.1: op_time must be (F, B) or (F, I, W)"),
    (["--schedule", "interleaved", "--stages", "4", "--microbatches", "6"], "divisible by stages"),
    (["--chunks", "2"], "only applies to the interleaved"),
    (["--microbatches", "0"], "microbatches must be a positive integer"),
    (["--bug", "f-backward-identity"], "does not apply"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert main(["pp", "run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_run_under_torchrun_uses_the_jobs_ranks_and_only_rank_0_prints():
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", "-m", "mtb_helpers.cli", "pp", "run",
                          "--microbatches", "4", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)   # one JSON document: a second rank printing would break it
    assert report["passed"] and report["checks"][0]["config"]["stages"] == 2


def test_the_explorer_runs_a_step_on_ranks_and_redraws_when_a_control_moves():
    import html

    import ipywidgets as widgets
    import matplotlib
    matplotlib.use("Agg")
    from mtb_helpers.pp.widget import explore_pipeline_on_ranks

    def shown(frame) -> str:   # the explorer's texts, as the HTML widgets below the controls hold them
        return "\n".join(html.unescape(w.value) for w in frame.items.children
                         if isinstance(w, widgets.HTML))

    frame = explore_pipeline_on_ranks("gpipe", stages=2, microbatches=2, op_time=(0.002, 0.004))
    out = shown(frame)
    assert "check against one process: PASSED" in out and "peak stashed [2, 2]" in out
    frame.children[1].children[0].value = 3                  # micro-batches slider
    assert "peak stashed [3, 3]" in shown(frame)
    frame.children[0].children[0].value = "interleaved"      # m = 3 is not a multiple of p = 2
    out = shown(frame)
    assert "ValueError" in out and "divisible by stages" in out
    frame.children[1].children[0].value = 4                  # now a multiple: interleaved runs
    out = shown(frame)
    # each chunk's op keeps the explorer's op time, so a stage's F and B double
    assert "check against one process: PASSED" in out
    assert "F = 4 ms, B = 8 ms per stage (2 and 4 ms per chunk)" in out
