"""``minitrainbench cost ...``: the prediction printed and as JSON, and bad input refused (exit 2)."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


def status(argv: list[str]) -> int:
    """The exit status of ``minitrainbench argv``: argparse's refusals raise SystemExit(2)."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


def test_cost_predict_prints_the_ring_all_reduce_time(capsys):
    argv = ["cost", "predict", "--collective", "all-reduce", "--bytes", "1e8", "--world-size", "8",
            "--alpha", "5e-6", "--bandwidth", "50e9"]
    assert main(argv) == 0
    # 14 α + 14/8 n/β = 70 µs + 3.5 ms
    assert "3.57 ms predicted" in capsys.readouterr().out
    assert main(argv + ["--json", "--algorithm", "naive"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["seconds"] == pytest.approx(14 * 5e-6 + 14 * 1e8 / 50e9)
    assert row["algorithm"] == "naive" and row["collective"] == "all-reduce"


@pytest.mark.parametrize("bad, match", [
    (["--collective", "all-sum"], "unknown collective"),
    (["--alpha", "0"], "alpha"),
    (["--bandwidth", "nan"], "bandwidth"),
    (["--algorithm", "tree", "--collective", "all-to-all"], "unknown algorithm"),
])
def test_cost_predict_refuses_bad_input_with_exit_2(capsys, bad, match):
    options = {"--collective": "all-reduce", "--bytes": "1000", "--world-size": "4",
               "--alpha": "1e-5", "--bandwidth": "1e9"}
    options.update(zip(bad[::2], bad[1::2]))
    assert status(["cost", "predict", *(x for kv in options.items() for x in kv)]) == 2
    assert match in capsys.readouterr().err


def test_cost_calibrate_prints_a_fit_as_json(capsys):
    argv = ["cost", "calibrate", "--world-size", "2", "--collective", "all-reduce",
            "--sizes", "1024,65536", "--k", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    fit = out["fits"]["all-reduce"]
    assert out["world_size"] == 2 and [r["bytes"] for r in out["rows"]] == [1024, 65536]
    assert fit["alpha"] > 0 and fit["bandwidth"] > 0 and len(fit["residuals"]) == 2


@pytest.mark.parametrize("bad, match", [(["--sizes", "1e13,1e3"], "use smaller sizes"),
                                        (["--sizes", "abc"], "argument --sizes: 'abc'"),
                                        (["--k", "0"], "argument --k: 0 is not >= 1")])
def test_cost_calibrate_refuses_bad_input_before_any_rank_starts(no_ranks, capsys, bad, match):
    assert status(["cost", "calibrate", *bad]) == 2
    assert match in capsys.readouterr().err
