"""Issue 25, item 3 at start-up: ``import mtb_helpers`` (and the command line's module) import no
torch, so ``minitrainbench`` handles Ctrl-C before the seconds torch takes to import; the stable
entry points still load on first use, and a check finds its own topic's bugs (its package
registers them) without the manifest.

Each case runs in a fresh interpreter: this test process has long imported everything."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

from mtb_helpers import topics
from mtb_helpers.checking.bug import registered


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON document, returned here."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


LOADED = """
    def loaded():
        return {m: m in sys.modules for m in ("torch", "torch.distributed.tensor", "mtb_helpers.tp",
                                               "mtb_helpers.runtime.ranks", "numpy")}
"""


def test_importing_the_package_and_its_command_line_imports_no_torch():
    found = fresh("    import sys, json" + LOADED + """
    import mtb_helpers, mtb_helpers.cli
    print(json.dumps(loaded()))
    """)
    assert not any(found.values()), found


def test_run_loads_on_first_use_without_any_topic():
    found = fresh("    import sys, json" + LOADED + """
    import mtb_helpers
    run = mtb_helpers.run
    before = loaded()
    assert run(lambda: 7, world_size=2) == [7, 7]
    print(json.dumps({"before": before, "after": loaded()}))
    """)
    # the name alone: torch, but no topic and no DTensor (the topics' layouts need it)
    assert found["before"]["torch"] and found["before"]["mtb_helpers.runtime.ranks"]
    assert not found["before"]["mtb_helpers.tp"], found
    assert not found["before"]["torch.distributed.tensor"], found
    # a call starts ranks (their forkserver preloads torch's lazy imports), still without
    # importing a topic
    assert not found["after"]["mtb_helpers.tp"], found


def test_every_stable_name_imports_from_the_top_and_bugs_lists_every_topic():
    got = fresh("""
    import json
    import mtb_helpers
    from mtb_helpers import (BUGS, MAX_WORLD_SIZE, RankError, RankTimeoutError, run, seed_all,
                             shutdown, warm_up)
    from mtb_helpers.runtime import ranks
    same = all(getattr(mtb_helpers, n) is getattr(ranks, n) for n in
               ("run", "shutdown", "warm_up", "seed_all", "RankError", "RankTimeoutError"))
    try:
        mtb_helpers.no_such_name
        missing = "no error"
    except AttributeError as exc:
        missing = str(exc)
    print(json.dumps({"bugs": BUGS, "same": same, "max": MAX_WORLD_SIZE == ranks.MAX_WORLD_SIZE,
                      "dir": sorted(set(mtb_helpers.__all__) - set(dir(mtb_helpers))),
                      "missing": missing}))
    """)
    expected = {}
    for topic in topics.TOPICS:
        for module in topic.bugs:
            expected.update({n: b.description for n, b in topic.module(module).BUGS.items()})
    assert got["bugs"] == expected and len(expected) >= 40
    assert got["same"] and got["max"] and got["dir"] == []
    assert got["missing"] == "module 'mtb_helpers' has no attribute 'no_such_name'"


def test_a_check_resolves_a_bug_name_without_anyone_reading_bugs_first():
    got = fresh("""
    import json
    from mtb_helpers.checking.bug import registered, resolve
    from mtb_helpers.tp.check import check_row_parallel
    bug = resolve("row-missing-allreduce", "row")
    report = check_row_parallel(world_size=2, bug="row-missing-allreduce")
    try:
        resolve("no-such-bug", "row")
        unknown = "no error"
    except ValueError as exc:
        unknown = str(exc)
    print(json.dumps({"description": bug.description, "passed": report.passed,
                      "unknown": unknown, "registered": sorted(registered())}))
    """)
    assert got["description"] == registered()["row-missing-allreduce"].description
    assert got["passed"] is False      # the bug was injected, and the check caught it
    assert "unknown bug 'no-such-bug'; this check can inject: " in got["unknown"]
    assert "row-missing-allreduce" in got["unknown"] and "cp-no-rescale" not in got["unknown"]
    # the check's own topic registered its bugs; no other topic was imported for it
    assert "row-missing-allreduce" in got["registered"] and "cp-no-rescale" not in got["registered"]


def test_a_bug_pickled_here_unpickles_in_a_fresh_process_after_its_topic():
    """What a spawned rank or a torchrun process does with a Bug sent to it: the function it runs
    is unpickled first, imports its topic, whose package registers the bugs; then the Bug is found
    by name. A Bug alone, its topic never imported there, is refused naming it."""
    from mtb_helpers.tp.layers import RowParallelLinear

    name = "row-missing-allreduce"
    data = pickle.dumps((RowParallelLinear, registered()[name])).hex()
    alone = pickle.dumps(registered()[name]).hex()
    got = fresh(f"""
    import json, pickle
    try:
        pickle.loads(bytes.fromhex("{alone}"))
        refused = "no error"
    except LookupError as exc:
        refused = str(exc)
    layer, bug = pickle.loads(bytes.fromhex("{data}"))
    print(json.dumps({{"description": bug.description, "refused": refused}}))
    """)
    assert got["description"] == registered()[name].description
    assert got["refused"].startswith(f"bug {name!r} is not registered in this process")


def test_a_bug_sent_to_ranks_started_before_its_topic_is_found_there():
    """Ranks started before any topic was imported (their forkserver holds none): the rank
    function ships by value, the correct layer it swaps by reference, so the rank imports tp,
    registering its bugs, before it unpickles the Bug."""
    from mtb_helpers.tp.layers import RowParallelLinear

    got = fresh("""
    import json, sys
    from mtb_helpers import run
    assert run(lambda: 7, world_size=2) == [7, 7]
    started_without_tp = "mtb_helpers.tp" not in sys.modules
    from mtb_helpers.checking.bug import resolve, swap
    from mtb_helpers.tp.layers import RowParallelLinear
    bug = resolve("row-missing-allreduce", "row")

    def on_rank(bug):
        return [swap(bug, RowParallelLinear).__name__, bug.description]

    print(json.dumps({"ranks": run(on_rank, bug, world_size=2), "early": started_without_tp}))
    """)
    wrong = registered()["row-missing-allreduce"]
    assert got["early"]
    assert got["ranks"] == [[wrong.replaces[RowParallelLinear].__name__, wrong.description]] * 2
