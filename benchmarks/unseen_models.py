"""Predictions on models swpipe was not tuned on (issue 47): predicted against measured, side by side, in one run.

    python benchmarks/unseen_models.py            # the whole run (about 10 minutes on 2 loaded cores)
    python benchmarks/unseen_models.py --quick    # tiny sizes, 1 round: a smoke run

Three models, none of which swpipe's costs or rules were tuned on:

* a conv net with skip connections (a U-Net, ``swpipe.gpipe``): ``benchmarks/gpipe_unet.py``, called;
* a small transformer LM (:func:`transformer_lm`: an embedding, 4 attention blocks, a head with
  cross-entropy) on 2 ranks, every PyTorch schedule at 4 and 8 micro-batches (``torch.distributed.pipelining``
  under torchrun, the job ``swpipe pp --model`` runs);
* an MLP of unequal stages (:func:`unequal_mlp`: an embedding first, a heavy head with the loss last), the same.

For each PP model ``benchmarks/pp.py``'s :func:`analyse` prints the rows (predicted and measured step and
peak per rank), the median |error|, whether the predicted-fastest configuration is within 5 % of the measured
fastest, and the memory errors. Then one model on 4 ranks over the machine's cores (the prediction with
``cores=`` the machine's), and item 7: on the unequal MLP, with and without a memory cap, the searched order
against the best built-in that fits, both measured by PyTorch's runtime with equal losses, and the lower bound
where the search cannot win. ``uptime``'s load is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from swpipe.pp import PPModel

_HERE = os.path.dirname(os.path.abspath(__file__))


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position: ``logits`` (batch, seq, vocab), ``target`` (batch, seq)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


class Block(nn.Module):
    """A pre-norm causal self-attention block with its feed-forward (no dropout: the losses must match)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class Head(nn.Module):
    """The final norm and the projection to the vocabulary."""

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def transformer_lm(vocab: int = 512, dim: int = 64, heads: int = 4, seq: int = 32, batch: int = 32,
                   blocks: int = 4, seed: int = 0) -> PPModel:
    """A small decoder-only LM: an embedding, ``blocks`` attention blocks and a head, cut evenly by ``swpipe pp``.

    Six children ([embedding, 4 blocks, head]): 2 stages of 3 children, or 4 of 2, 2, 1, 1. The target is the
    input shifted by one token.
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(vocab, dim), *[Block(dim, heads) for _ in range(blocks)], Head(dim, vocab))
    g = torch.Generator().manual_seed(10_000 + seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return PPModel(model=model, batch=tokens[:, :-1].contiguous(), target=tokens[:, 1:].contiguous(),
                   loss_fn=lm_loss)


def unequal_mlp(vocab: int = 256, dim: int = 64, hidden: int = 1024, classes: int = 512, batch: int = 128,
                seed: int = 0) -> PPModel:
    """An MLP of unequal stages: an embedding first (cheap), two small blocks, a heavy head with the loss last.

    Four children, cut evenly: 2 stages ([embedding, block], [block, head]) or 4 (one child each), the last
    stage several times the first's cost either way. The loss is cross-entropy over ``classes``.
    """
    torch.manual_seed(seed)
    head = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, classes))
    model = nn.Sequential(nn.Embedding(vocab, dim), nn.Sequential(nn.Linear(dim, dim), nn.Tanh()),
                          nn.Sequential(nn.Linear(dim, dim), nn.Tanh()), head)
    g = torch.Generator().manual_seed(10_000 + seed)
    return PPModel(model=model, batch=torch.randint(0, vocab, (batch,), generator=g),
                   target=torch.randint(0, classes, (batch,), generator=g), loss_fn=nn.functional.cross_entropy)
