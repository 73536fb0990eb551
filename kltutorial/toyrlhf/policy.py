r"""The table policy of the toy task and what every trainable policy of the recipes provides (section 11).

A policy for :mod:`kltutorial.toyrlhf.recipes` is a ``torch.nn.Module`` with

* ``forward(sequences) -> (N, T, V)``: next-token log-probs :math:`\log\pi_\theta(\cdot\mid y_{<t})` at
  every position of the given sequences, differentiable;
* ``values(sequences) -> (N, T)``: a critic's :math:`V(y_{<t})`, the value of the state before token
  :math:`t` (PPO's value head);
* ``table() -> (P, V)``: the next-token log-probs of every prefix row, for sampling and for the exact sums of
  :mod:`kltutorial.exact`.

:class:`TablePolicy` keeps one row of logit offsets per prefix on top of the reference, so it starts at
:math:`\pi_\mathrm{ref}` and can represent every distribution over sequences; its critic is a table with one
value per prefix. :class:`~kltutorial.toyrlhf.transformer.TransformerPolicy` is the neural one.

Shapes: N sequences, T = 5 positions, V = 8 tokens, P = 4681 prefix rows.
"""

from __future__ import annotations

import torch

from .. import exact as ex
from .task import ToyTask, check_task
from .trainer import update_running_values

__all__ = ["TablePolicy", "prefix_rows"]


def prefix_rows(space: ex.SequenceSpace, sequences: torch.Tensor) -> torch.Tensor:
    """The next-token table row of each position's prefix, shape (N, T), from token ids (N, T).

    The row of :math:`y_{<t}` is ``space.offsets[t]`` plus :math:`y_{<t}` read in base V, the layout of
    :class:`~kltutorial.exact.SequenceSpace` (``space.prefix_ids`` holds the same for listed sequences).

    Examples
    --------
    >>> space = ex.SequenceSpace(vocab_size=2, length=2)
    >>> prefix_rows(space, torch.tensor([[1, 0], [0, 1]])).tolist()
    [[0, 2], [0, 1]]
    """
    rows = torch.empty_like(sequences)
    code = torch.zeros_like(sequences[:, 0])  # (N,): y_<t in base V
    for t in range(sequences.shape[1]):
        rows[:, t] = space.offsets[t] + code
        code = code * space.vocab_size + sequences[:, t]
    return rows


def visited_logprobs(ref_table: torch.Tensor, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``torch.log_softmax(ref_table + theta, -1)[rows]``, computed on the rows that ``rows`` visits only.

    A batch of 2,048 sequences from the reference visits about 1,200 of the 4,681 prefix rows;
    normalising only those (each once, then indexed) makes a PPO run of section 9 about a quarter
    faster than normalising the whole table at every forward pass. The numbers are the same bit for
    bit, and so is the gradient reaching ``theta``: each row is normalised on its own either way, and
    the gradients of a row's repeated visits are summed before the row's softmax backward, as the
    whole-table version sums them (tests/test_toyrlhf.py compares the bits). ``rows``: int64 row ids of
    any shape S; returns S + (V,).
    """
    seen = torch.zeros(ref_table.shape[0], dtype=torch.bool)
    seen[rows] = True
    visited = seen.nonzero().squeeze(1)  # (U,), ascending, as torch.unique's without its sort
    where = (torch.cumsum(seen, 0) - 1)[rows]  # each visit's place among the visited rows
    return torch.log_softmax(ref_table[visited] + theta[visited], dim=-1)[where]


class TablePolicy(torch.nn.Module):
    r""":math:`\pi_\theta(\cdot\mid h) = \mathrm{softmax}(\log\pi_\mathrm{ref}(\cdot\mid h) + \theta_h)`, one
    row :math:`\theta_h` per prefix, zero at the start; and a value table, one entry per prefix.

    Parameters
    ----------
    task : ToyTask

    Examples
    --------
    >>> import numpy as np
    >>> from kltutorial import toyrlhf as toy
    >>> task = toy.make_task(toy.TaskConfig(), rng=np.random.default_rng(0),
    ...                      data_rng=np.random.default_rng([0, 100, 0]))
    >>> policy = TablePolicy(task)
    >>> bool(torch.allclose(policy.table(), task.ref_table))  # pi_theta = pi_ref at the start
    True
    >>> policy(task.space.sequences[:3]).shape, policy.values(task.space.sequences[:3]).shape
    (torch.Size([3, 5, 8]), torch.Size([3, 5]))
    """

    def __init__(self, task: ToyTask) -> None:
        super().__init__()
        check_task(task)
        self.space = task.space
        self.register_buffer("ref_table", task.ref_table.clone())  # (P, V)
        P, V = task.ref_table.shape
        self.theta = torch.nn.Parameter(torch.zeros(P, V, dtype=torch.float64))  # (P, V) logit offsets
        self.value = torch.nn.Parameter(torch.zeros(P, dtype=torch.float64))  # (P,) critic
        self.register_buffer("visits", torch.zeros(P, dtype=torch.float64))  # (P,) the critic's visit counts

    def table(self) -> torch.Tensor:
        """Next-token log-probs of every prefix row, shape (P, V)."""
        return torch.log_softmax(self.ref_table + self.theta, dim=-1)

    def forward(self, sequences: torch.Tensor) -> torch.Tensor:
        """Next-token log-probs at every position of ``sequences`` (N, T), shape (N, T, V).

        ``table()[prefix_rows(space, sequences)]``, bit for bit, with only the visited rows normalised.
        """
        return visited_logprobs(self.ref_table, self.theta, prefix_rows(self.space, sequences))

    def values(self, sequences: torch.Tensor) -> torch.Tensor:
        """The value table at every position's prefix, shape (N, T)."""
        return self.value[prefix_rows(self.space, sequences)]

    def fit_values(self, sequences: torch.Tensor, returns: torch.Tensor, min_step: float = 0.2) -> None:
        """Move each visited prefix's value towards the batch mean of its returns (N, T), in place.

        The table's critic is fitted as :func:`~kltutorial.toyrlhf.train_policy`'s is: a running mean of a
        prefix's returns, then an exponential average with weight at least ``min_step``, so that it follows
        the policy. (A network's value head is fitted by regression inside PPO's loss instead.)
        """
        with torch.no_grad():
            update_running_values(self.value.data, self.visits, prefix_rows(self.space, sequences), returns,
                                  min_step)
