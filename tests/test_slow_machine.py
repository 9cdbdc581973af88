"""benchmarks/slow_machine.py, on a stand-in cgroup tree: bad input stops before any cgroup is
made, the quota and period land in the files the kernel reads (v1 and v2), the command runs inside
the group with its exit status passed on, and the group is left and removed afterwards, also when
the command fails."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "slow_machine.py"


@pytest.fixture
def slow(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("slow_machine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    removed, rmdir = [], os.rmdir

    def remove(path):   # a real cgroup directory is removed by rmdir although it lists files
        removed.append(path)
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        rmdir(path)
    monkeypatch.setattr(module.os, "rmdir", remove)
    module.removed = removed
    return module


def stand_in(module, monkeypatch, root: Path, version: int) -> Path:
    root.mkdir()
    if version == 1:
        (root / "cpu.cfs_quota_us").write_text("-1")
        monkeypatch.setattr(module, "V1", str(root))
    else:
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids")
        monkeypatch.setattr(module, "V1", str(root / "absent"))
        monkeypatch.setattr(module, "V2", str(root))
    return root


@pytest.mark.parametrize("args, said", [
    (["--percent", "0", "--", "true"], "--percent must be between 1"),
    (["--percent", "nan", "--", "true"], "--percent must be between 1"),
    (["--percent", "100000", "--", "true"], "--percent must be between 1"),
    (["--percent", "50", "--period-ms", "0.1", "--", "true"], "--period-ms must be between"),
    (["--percent", "50"], "give the command"),
])
def test_bad_input_stops_before_any_cgroup_is_made(slow, monkeypatch, capsys, args, said):
    made = []
    monkeypatch.setattr(slow, "make_group", lambda *a: made.append(a))
    with pytest.raises(SystemExit) as exc:
        slow.main(args)
    assert exc.value.code == 2 and said in capsys.readouterr().err and made == []


@pytest.mark.parametrize("version", [1, 2])
def test_the_command_runs_in_a_group_with_the_quota_and_the_group_is_removed(
        slow, monkeypatch, tmp_path, version):
    root = stand_in(slow, monkeypatch, tmp_path / "cg", version)
    seen = tmp_path / "seen"
    # the command reads the group's files while it runs: they hold the quota and this script's pid
    code = ("import glob, os, sys; g = glob.glob(sys.argv[1] + '/mtb_slow_*')[0]; "
            "open(sys.argv[2], 'w').write(repr({f: open(os.path.join(g, f)).read() "
            "for f in sorted(os.listdir(g))})); sys.exit(3)")
    status = slow.main(["--percent", "68", "--period-ms", "20", "--", sys.executable, "-c", code,
                        str(root), str(seen)])
    files = eval(seen.read_text())
    group = str(root / f"mtb_slow_{os.getpid()}")
    assert status == 3                                      # the command's own exit status
    assert files["cgroup.procs"] == str(os.getpid())        # joined before the command started
    if version == 1:
        assert files["cpu.cfs_period_us"] == "20000" and files["cpu.cfs_quota_us"] == "13600"
    else:
        assert files["cpu.max"] == "13600 20000"
    assert slow.removed == [group] and not os.path.exists(group)
    assert (root / "cgroup.procs").read_text() == str(os.getpid())   # moved back to the parent


def test_without_a_writable_cgroup_it_says_what_it_needs(slow, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(slow, "V1", str(tmp_path / "no-v1"))
    monkeypatch.setattr(slow, "V2", str(tmp_path / "no-v2"))
    with pytest.raises(SystemExit) as exc:
        slow.main(["--percent", "50", "--", "true"])
    assert exc.value.code == 2 and "needs write access" in capsys.readouterr().err
