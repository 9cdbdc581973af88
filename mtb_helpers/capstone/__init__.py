"""The capstone (notebook 12): a tiny GPT trained under tp x pp x dp x cp, equal to one process
(``train_parallel``, checked by ``check.check_capstone``, ``minitrainbench train``)."""
from mtb_helpers.capstone.data import VOCAB, batch_for_step, corpus, decode, encode
from mtb_helpers.capstone.grid import Grid, GridLayout, group_ranks
from mtb_helpers.capstone.model import GPTConfig, TinyGPT, make_model
from mtb_helpers.capstone.parallel import ParallelRun, train_parallel
from mtb_helpers.capstone.reference import TrainConfig, train_reference
from mtb_helpers.capstone.validate import admissible_layouts, validate
from mtb_helpers.capstone import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["VOCAB", "batch_for_step", "corpus", "decode", "encode", "Grid", "GridLayout",
           "group_ranks", "GPTConfig", "TinyGPT", "make_model", "ParallelRun",
           "train_parallel", "TrainConfig", "train_reference", "admissible_layouts", "validate"]
