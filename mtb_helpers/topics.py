"""The manifest: the one list of the course's topics.

Adding a topic is its folder plus one line here. Everything that lists the topics reads this
tuple: the ``minitrainbench`` command (each topic's ``cli.register``, and the command group a topic
opens), the course's bug list (``mtb_helpers.BUGS``), ``mtb_helpers.check`` (every ``check_*`` from
one import path) and ``tests/test_layering.py`` (which modules are a topic's layers). Nothing below
the topics (runtime, comm, checking, plots, widgets) imports a topic; the topics are found here by
name, when the top of the package asks.

    Topic("dp", group="dp", group_help="data parallelism: ...",
          checks=("check_data_parallel",),            # in <package>.check; "module.func" elsewhere
          bugs=("bugs",),                             # each registers BUGS: checking/bug.py
          layers=("strategies", "fsdp"))              # modules that must not import upwards

A topic that adds commands to another topic's group (sp adds ``tp sequence``) or only top-level
commands (``minitrainbench train``) says no ``group``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from mtb_helpers.checking.bug import Bug, registered

__all__ = ["Topic", "TOPICS", "listed", "bug_registry", "check_functions", "cli_groups"]


@dataclass(frozen=True)
class Topic:
    """One topic folder: its name, its package, the command group it opens, its checks, its bug
    modules and its layer modules (module names relative to ``package``)."""
    name: str
    package: str = ""                      # default: mtb_helpers.<name>
    group: str | None = None               # the `minitrainbench <group>` it opens, if any
    group_help: str = ""
    checks: tuple[str, ...] = ()
    bugs: tuple[str, ...] = ("bugs",)
    layers: tuple[str, ...] = ("layers",)

    def __post_init__(self) -> None:
        if not self.package:
            object.__setattr__(self, "package", f"mtb_helpers.{self.name}")
        if self.group is not None and not self.group_help:
            raise ValueError(f"topic {self.name!r} opens the group {self.group!r} without a help line")

    def module(self, name: str):
        """``<package>.<name>``, imported."""
        return importlib.import_module(f"{self.package}.{name}")


TOPICS: tuple[Topic, ...] = (
    Topic("collectives", checks=("check_collectives",), layers=("ops",)),
    Topic("tp", group="tp",
          group_help="tensor-parallel checks (column, row, MLP, attention, vocabulary) and the "
                     "sequence-parallel block",
          checks=("check_column_parallel", "check_row_parallel", "check_tp_mlp",
                  "attention_check.check_tp_attention", "vocab_check.check_vocab_parallel"),
          bugs=("bugs", "attention_bugs"), layers=("layers", "attention", "vocab")),
    Topic("sp", checks=("check_sequence_parallel",), layers=("layers", "dropout")),
    Topic("pp", group="pp", group_help="pipeline schedules and their bubble",
          checks=("check_pipeline",),
          layers=("schedules", "simulator", "runtime", "stage", "p2p")),
    Topic("grid", group="grid", group_help="tensor x data parallelism on one grid of ranks",
          checks=("check_grid",)),
    Topic("dp", group="dp",
          group_help="data parallelism: DDP, ZeRO-1/2, ZeRO-3/FSDP against one process, step by step",
          checks=("check_data_parallel", "overlap_check.check_overlap"),
          layers=("strategies", "fsdp", "overlap", "sharded_optimizer", "fsdp_wrapper", "fsdp_units")),
    Topic("moe", group="moe",
          group_help="expert parallelism: token dispatch and combine with all-to-all",
          checks=("check_moe",)),
    Topic("cp", group="cp",
          group_help="context parallelism: ring and all-gather attention on sequence shards",
          checks=("check_context_parallel",),
          layers=("sharding", "ring", "allgather", "online", "base")),
    Topic("capstone", checks=("check_capstone",), layers=("model", "layers", "grid", "data")),
    Topic("cost", group="cost",
          group_help="time: the α-β model's predictions and this machine's calibration",
          bugs=(), layers=("model", "algorithms")),
    Topic("plan", checks=("check_plan",), layers=("specs", "memory", "budget", "steptime", "search")),
)


def listed(topics: tuple[Topic, ...] | None = None) -> tuple[Topic, ...]:
    """``topics``, or the manifest's ``TOPICS`` read now (not when a caller was defined), so that
    a line added to the manifest is all a new topic takes."""
    return TOPICS if topics is None else topics


def cli_groups(topics: tuple[Topic, ...] | None = None) -> dict[str, str]:
    """{group name: help line} of the command groups the topics open, in manifest order."""
    return {t.group: t.group_help for t in listed(topics) if t.group is not None}


def check_functions(topics: tuple[Topic, ...] | None = None) -> dict[str, Callable]:
    """{name: function} of every topic's checks ("check_x" lives in <package>.check)."""
    found = {}
    for topic in listed(topics):
        for entry in topic.checks:
            module, _, func = entry.rpartition(".")
            found[func] = getattr(topic.module(module or "check"), func)
    return found


def bug_registry() -> dict[str, Bug]:
    """The registry (``registered()``, checking/bug.py) once every topic's bug modules are imported:
    each registers its bugs at import, refusing a name another topic declared, naming both. All of
    them: a registry holds what was imported, so there is no asking for some topics' bugs here."""
    for topic in listed():
        for module in topic.bugs:
            topic.module(module)
    return registered()
