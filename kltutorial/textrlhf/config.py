"""The configuration of a real-text RLHF run, frozen and validated (as :mod:`kltutorial.toyrlhf.config`).

Randomness is not configuration: :func:`~kltutorial.textrlhf.train_text` takes the generator its caller
creates.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..toyrlhf.config import check_field

__all__ = ["TEXT_BETAS", "TextTrainConfig"]

#: The β of the book's sweep: no penalty, then from weak to strong.
TEXT_BETAS: tuple[float, ...] = (0.0, 0.01, 0.05, 0.2)


@dataclass(frozen=True)
class TextTrainConfig:
    """One run of :func:`~kltutorial.textrlhf.train_text`: REINFORCE on the gold reward minus β times the
    sequence's k1, from the stored base model. The defaults are the book's run.

    Examples
    --------
    >>> TextTrainConfig().batch_size
    64
    >>> TextTrainConfig(beta=-1.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: TextTrainConfig.beta must be a finite number >= 0, got -1.0: ...
    """

    beta: float = 0.05  # the KL coefficient; 0 switches the penalty off
    steps: int = 150  # policy updates, one batch each: enough for β = 0.05 to settle, β = 0 to collapse
    batch_size: int = 64  # B, responses sampled per step
    lr: float = 1e-3  # Adam's step on every weight of the policy
    max_new_tokens: int = 24  # the most tokens a response may take, the end token included
    max_grad_norm: float = 1.0  # gradient clipping, as TRL's default

    def __post_init__(self) -> None:
        check_field(self, "beta", "it is the KL coefficient (the book sweeps 0, 0.01, 0.05 and 0.2)", low=0)
        check_field(self, "steps", "the number of policy updates (the default is 150)", low=1, integer=True)
        check_field(self, "batch_size", "the leave-one-out baseline averages the other responses of the "
                    "batch (the default is 64)", low=2, integer=True)
        check_field(self, "lr", "it is Adam's learning rate (the default is 1e-3)", low=0, low_open=True)
        check_field(self, "max_new_tokens", "the response budget in tokens, at most 64 (the default is 24)",
                    low=1, high=64, integer=True)
        check_field(self, "max_grad_norm", "the gradient's norm is clipped to it (the default is 1)",
                    low=0, low_open=True)
