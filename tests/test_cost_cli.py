"""``minitrainbench cost ...``: the prediction printed and as JSON, and bad input refused (exit 2)."""
from __future__ import annotations

import json

import pytest

from mtb_helpers.cli import main


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
    assert main(["cost", "predict", *(x for kv in options.items() for x in kv)]) == 2
    assert match in capsys.readouterr().err
