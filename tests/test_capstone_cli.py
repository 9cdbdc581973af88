"""``minitrainbench train``: the per-step loss table, --json, --plot, --bug, exit codes 0 / 1 / 2."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


def test_a_layout_trains_like_one_process_and_prints_the_table(capsys, tmp_path):
    png = tmp_path / "loss.png"
    assert main(["train", "--tp", "2", "--pp", "2", "--steps", "2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "step  parallel" in out and out.count("yes") == 2
    assert "rank 0 measured" in out and "rank 0 formula" in out
    assert out.rstrip().endswith("every step matches one process")
    assert png.stat().st_size > 10_000


def test_json_and_a_bug_exit_1(capsys):
    assert main(["train", "--dp", "2", "--steps", "2", "--json",
                 "--bug", "capstone-dp-allreduce-in-tp-group"]) == 1
    data = json.loads(capsys.readouterr().out)
    (check,) = data["checks"]
    assert data["passed"] is False and check["config"]["bug"] == "capstone-dp-allreduce-in-tp-group"
    assert [r["passed"] for r in check["rows"] if r["quantity"] == "loss"] == [True, False]


def test_help_lists_the_deliberate_bugs(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("capstone-dp-allreduce-in-tp-group", "capstone-grads-not-averaged-over-cp",
                 "capstone-cp-local-positions", "capstone-sp-grads-not-reduced"):
        assert name in out


@pytest.mark.parametrize("argv, message", [
    (["train", "--tp", "2", "--pp", "2", "--world-size", "8"], "tp*pp*dp*cp = 2*2*1*1 = 4 is not the world size 8"),
    (["train", "--tp", "3"], "heads=4 is not divisible by tp=3"),
    (["train", "--cp", "3"], "seq=16 is not divisible by cp=3"),
    (["train", "--dp", "2", "--cp", "2", "--tp", "2", "--pp", "2"], "16 ranks"),
    (["train", "--bug", "nope"], "unknown bug"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def _torchrun(*args: str):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "mtb_helpers.cli", "train", *args],
                          capture_output=True, text=True, timeout=300)


def test_under_torchrun_the_job_trains_and_only_rank_0_prints():
    out = _torchrun("--dp", "2", "--steps", "2", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)   # one JSON document: a second rank printing would break it
    assert data["passed"] is True and data["checks"][0]["config"]["dp"] == 2


def test_under_torchrun_a_layout_of_another_size_exits_2():
    out = _torchrun("--tp", "2", "--pp", "2", "--steps", "1")
    assert out.returncode != 0
    assert "= 4 is not the world size 2" in out.stderr
