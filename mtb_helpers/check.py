"""Every check of the course, from one import path::

    from mtb_helpers.check import check_tp_mlp, check_data_parallel, ...

Each lives in its topic folder (``mtb_helpers/<topic>/check.py``); the manifest
(:mod:`mtb_helpers.topics`) names them, and this module only gathers them.
"""
from mtb_helpers.topics import check_functions

globals().update(check_functions())
__all__ = sorted(check_functions())
