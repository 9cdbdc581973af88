"""The capstone's text: a few KB of sentences generated from a small grammar, character tokens.

No download: ``corpus()`` builds the same text on every machine from a fixed seed (Python's
``random.Random`` is specified to give the same sequence everywhere). Tokens are characters from
``ALPHABET``; the vocabulary is padded to ``VOCAB`` = 32 entries so that it divides by every tensor
size up to 8 (Megatron-LM pads its vocabulary the same way, ``--make-vocab-size-divisible-by``);
the padding tokens never occur, and the model learns to give them no probability.

A training batch is ``B`` windows of ``s + 1`` characters at fixed offsets: the first ``s`` are the
input, the last ``s`` the target (the next character). Step ``k`` reads windows
``k*B .. k*B + B - 1`` of a fixed stride, wrapping around the text, so every run of every layout
sees the very same batches. Batches are sequence first, ``[s, B]``, like the rest of the course.
"""
from __future__ import annotations

import random

import torch

__all__ = ["ALPHABET", "VOCAB", "corpus", "encode", "decode", "batch_for_step"]

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,\n"
VOCAB = 32                       # len(ALPHABET) = 30, padded to a multiple of 8
STRIDE = 37                      # window offsets k*B*STRIDE ...: prime, so windows overlap little

_NOUNS = ["rank", "shard", "gradient", "pipeline", "stage", "head", "token", "layer", "batch",
          "ring", "group", "tensor", "model", "optimizer", "sequence", "bucket"]
_VERBS = ["sends", "holds", "gathers", "reduces", "splits", "waits for", "computes", "receives",
          "scatters", "averages", "checks", "updates"]
_ADJS = ["every", "each", "the next", "the last", "one", "its own", "a full", "a partial"]
_ENDS = [".", ".", ".", ","]


def corpus(n_chars: int = 4096, seed: int = 1234) -> str:
    """``n_chars`` characters of grammatical nonsense about parallelism, the same everywhere."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        words = [rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_VERBS), rng.choice(_ADJS),
                 rng.choice(_NOUNS)]
        sentence = " ".join(words) + rng.choice(_ENDS) + ("\n" if rng.random() < 0.2 else " ")
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:n_chars]


def encode(text: str) -> torch.Tensor:
    """Characters -> token ids ``[n]`` (int64)."""
    return torch.tensor([ALPHABET.index(c) for c in text], dtype=torch.long)


def decode(ids) -> str:
    return "".join(ALPHABET[int(i)] if int(i) < len(ALPHABET) else "?" for i in ids)


def batch_for_step(step: int, batch: int, seq: int, tokens: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)``, each ``[s, B]``: window i of step k starts at
    ``((k*B + i) * STRIDE) mod (n - s - 1)``; the target is the input shifted by one."""
    tokens = encode(corpus()) if tokens is None else tokens
    span = tokens.numel() - seq - 1
    starts = [((step * batch + i) * STRIDE) % span for i in range(batch)]
    windows = torch.stack([tokens[a:a + seq + 1] for a in starts], dim=1)   # [s+1, B]
    return windows[:-1].contiguous(), windows[1:].contiguous()
