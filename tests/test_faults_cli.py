"""Issue 25, items 3 and 4: every ``minitrainbench`` command ends the documented way whatever
happens: Ctrl-C is one line and exit 130 (no traceback, nothing left behind); with ``--json``
stdout is exactly one JSON document, failures and their diagnosis included."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from mtb_helpers import cli
from mtb_helpers.runtime.errors import RankError, RankTimeoutError


def leaf_commands() -> list[list[str]]:
    """``[command]`` or ``[group, subcommand]`` for every command the parser knows, with its
    required options given a value it accepts."""
    out = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            required = [[a.option_strings[0], str(a.choices[0] if a.choices else 1)]
                        for a in parser._actions if a.required and a.option_strings]
            out.append(prefix + sum(required, []))
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, prefix + [name])

    walk(cli.build_parser(), [])
    return out


def _with_handler(monkeypatch, handler):
    """main() as usual, but every command's handler replaced by ``handler``."""
    real = cli.build_parser

    def build(*args):
        parser = real(*args)
        parse = parser.parse_args

        def parse_args(argv=None):
            ns = parse(argv)
            ns.func = handler
            return ns
        parser.parse_args = parse_args
        return parser
    monkeypatch.setattr(cli, "build_parser", build)


def _interrupt(args):
    raise KeyboardInterrupt


def test_every_command_turns_ctrl_c_into_one_line_and_130(monkeypatch, capsys):
    commands = leaf_commands()
    assert len(commands) >= 12 and ["train"] in commands and ["pp", "run"] in commands
    _with_handler(monkeypatch, _interrupt)
    for argv in commands:
        for extra in ([], ["--json"]):
            try:
                status = cli.main(argv + extra)
            except SystemExit:      # a command without --json (pp bubble ...): plain form only
                assert extra, argv
                capsys.readouterr()
                continue
            out, err = capsys.readouterr()
            assert status == 130, argv
            assert err == "minitrainbench: interrupted\n", (argv, err)
            if extra:
                doc = json.loads(out)
                assert doc["passed"] is False and doc["error"]["type"] == "KeyboardInterrupt"
            else:
                assert out == ""


@pytest.mark.parametrize("exc, status, diagnosis", [
    (RankError(2, "rank 2 raised ZeroDivisionError: boom\n\nTraceback ..."), 1, "rank 2 failed"),
    (RankTimeoutError("ranks 0, 1 did not answer within 3 s", [], {}), 1, "stopped answering"),
    (ValueError("steps must be a positive integer, got 0"), 2, "bad arguments"),
])
def test_json_is_one_document_whatever_ends_the_command(monkeypatch, capsys, exc, status,
                                                        diagnosis):
    def fail(args):
        raise exc
    _with_handler(monkeypatch, fail)
    for argv in (["train", "--json"], ["cp", "check", "--json"], ["tp", "vocab", "--json"]):
        assert cli.main(argv) == status
        out, err = capsys.readouterr()
        doc = json.loads(out)                                  # the whole of stdout, one document
        assert doc["passed"] is False and doc["checks"] == []
        assert diagnosis in doc["error"]["diagnosis"] and doc["error"]["message"] == str(exc)
        assert "Traceback (most recent call last)" not in err and err.startswith("minitrainbench")


def test_bad_arguments_under_json_are_a_json_document_too(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["pp", "run", "--json", "--schedule", "nope"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and "invalid choice" in err
    assert json.loads(out)["error"]["diagnosis"].startswith("bad arguments")
    assert cli.main(["pp", "run", "--json", "--microbatches", "0"]) == 2
    assert "microbatches" in json.loads(capsys.readouterr().out)["error"]["message"]


def test_pp_run_json_on_a_hang_is_json_with_the_diagnosis(capsys):
    status = cli.main(["pp", "run", "--json", "--stages", "2", "--microbatches", "2", "--bug",
                       "pp-blocking-send", "--timeout", "3"])
    doc = json.loads(capsys.readouterr().out)
    assert status == 1 and doc["passed"] is False
    assert doc["error"]["diagnosis"] == "the pipeline step hung"
    assert doc["error"]["type"] == "RankTimeoutError" and "blocked in the send" in \
        doc["error"]["message"]


def _leftovers(pid_tree: set[int]) -> set[int]:
    return {p for p in pid_tree if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}


def test_ctrl_c_during_a_real_train_run_is_one_line_130_and_leaves_nothing(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mtb_helpers.cli", "train", "--tp", "2",
                             "--steps", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    first = proc.stderr.readline()          # the first progress line: ranks are training
    assert first.startswith("[train] step"), first
    tree = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    assert len(tree) >= 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    lines = [line for line in err.splitlines() if not line.startswith("[train] step")]
    assert lines == ["minitrainbench: interrupted"], err
    assert "Traceback" not in out
    deadline = time.monotonic() + 10
    while _leftovers(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _leftovers(tree)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("mtb-")], list(tmp_path.iterdir())


def _chatty(args):
    """A command that prints a note for the student and runs a rank that prints, then reports."""
    from mtb_helpers import run
    from mtb_helpers.checking.command import print_document

    def rank_prints():
        print("hello from a rank")
        return 1
    print("[mtb] emulated link: a note for the student")
    run(rank_prints, world_size=2)
    print_document({"passed": True, "checks": []})
    return 0


def test_under_json_stdout_holds_the_document_and_notes_go_to_stderr(monkeypatch, capsys):
    """What a command prints while it runs (the emulated link's note, the ranks' relayed output)
    must not break ``--json``: CI's failure at 05e3b6c was such a note ahead of the document."""
    _with_handler(monkeypatch, _chatty)
    assert cli.main(["dp", "overlap", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"passed": True, "checks": []}        # the whole of stdout
    assert "a note for the student" in err and "[rank 1] hello from a rank" in err
    assert cli.main(["dp", "overlap"]) == 0                        # without --json: on stdout
    out, err = capsys.readouterr()
    assert "a note for the student" in out and "[rank 0] hello from a rank" in out
