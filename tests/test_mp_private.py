"""The private multiprocessing names the runtime uses are there on this Python (CI runs this file on
3.11 and on Colab's 3.13), and when one is missing the runtime falls back loudly, naming the cost."""
from __future__ import annotations

import sys
import warnings
from multiprocessing import spawn as mp_spawn
from multiprocessing import util as mp_util

import pytest

from mtb_helpers.runtime import mp_private


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(mp_private, "_warned", set())


def test_every_private_name_is_there_on_this_tested_python(fresh_warnings):
    assert sys.version_info[:2] in mp_private.TESTED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(mp_private.available(name) for name in mp_private.COSTS)


def test_the_start_patch_drops_main_and_swaps_the_helper_starter_then_restores_both():
    original_prep, original_spawn = mp_spawn.get_preparation_data, mp_util.spawnv_passfds

    def starter(path, args, passfds):
        return 0

    with mp_private.patched_start(starter):
        data = mp_spawn.get_preparation_data("mtb")
        assert "init_main_from_path" not in data and "init_main_from_name" not in data
        assert mp_util.spawnv_passfds is starter
    assert mp_spawn.get_preparation_data is original_prep
    assert mp_util.spawnv_passfds is original_spawn


def test_a_missing_starter_falls_back_with_one_warning_naming_the_cost(monkeypatch, fresh_warnings):
    monkeypatch.delattr(mp_util, "spawnv_passfds")
    with pytest.warns(RuntimeWarning, match=r"spawnv_passfds is missing.*~200 MB"):
        with mp_private.patched_start(lambda *a: 0):
            assert not hasattr(mp_util, "spawnv_passfds")    # left as it is: the public path
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # said once, not at every start
        with mp_private.patched_start(lambda *a: 0):
            pass


@pytest.mark.parametrize("name, call, cost", [
    ("forkserver._forkserver._stop", mp_private.stop_forkserver, "memory is held"),
    ("util._run_finalizers", mp_private.run_exit_finalizers, "pymp-"),
])
def test_missing_clean_up_names_fall_back_loudly(monkeypatch, fresh_warnings, name, call, cost):
    owner, attr = name.rsplit(".", 1)
    monkeypatch.delattr(type(mp_private._lookup(owner)) if owner.endswith("_forkserver")
                        else mp_private._lookup(owner), attr)
    with pytest.warns(RuntimeWarning, match=cost):
        call()
