"""The two configurations of the toy RLHF experiment (book section 11): the task and the training run.

Frozen dataclasses in the style of nanoGPT's ``GPTConfig``, validated once when they are built, with
messages that say how to fix the input (as TRL's configs do). Randomness is not configuration:
:func:`~kltutorial.toyrlhf.make_task` and :func:`~kltutorial.toyrlhf.train_policy` take the generators
their caller creates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FIXED_BETAS", "TaskConfig", "TrainConfig"]


def check_field(
    owner: object, name: str, hint: str, *, low: float, low_open: bool = False, high: float | None = None,
    high_open: bool = False, integer: bool = False,
) -> None:
    """Raise unless the field ``name`` of ``owner`` is a finite number (an int where ``integer``, never a
    bool) in the interval given by ``low`` and ``high``; ``hint`` says what the field means."""
    value = getattr(owner, name)
    where = f"{type(owner).__name__}.{name}"
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds):
        want = "an int" if integer else "a real number"
        raise TypeError(f"{where} must be {want}, got {type(value).__name__} {value!r}: {hint}")
    x = float(value)
    above = x > low if low_open else x >= low
    below = high is None or (x < high if high_open else x <= high)
    if math.isfinite(x) and above and below:
        return
    if high is None:
        rule = f"be {'an int' if integer else 'a finite number'} {'>' if low_open else '>='} {low:g}"
    else:
        rule = f"lie in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    raise ValueError(f"{where} must {rule}, got {value!r}: {hint}")


#: The fixed β of the book's sweep (section 11) and of ``python -m kltutorial.toyrlhf``, largest first.
FIXED_BETAS: tuple[float, ...] = (1.0, 0.5, 0.3, 0.2, 0.15, 0.1)


@dataclass(frozen=True)
class TaskConfig:
    """The toy problem: reference chain, gold reward, preference data and Bradley–Terry proxy.

    :func:`~kltutorial.toyrlhf.make_task` gives the formulas; the symbols are those of book section 11.

    Examples
    --------
    >>> TaskConfig(n_pairs=300).n_pairs
    300
    >>> TaskConfig(bang_prob=1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: TaskConfig.bang_prob must lie in (0, 1), got 1.5: it is the probability of "!" at every ...
    """

    # N, the preference pairs the proxy is fitted to. With 100, few pairs hold two "!", and the fitted
    # proxy rates every "!" above every other token (section 11 sweeps N from 30 to 10,000).
    n_pairs: int = 100
    # P("!") at every position of the reference chain: sequences with two or more "!" then hold about
    # 5 % of the reference mass, the region where the proxy has little data.
    bang_prob: float = 0.08
    dirichlet_alpha: float = 1.0  # concentration of the chain's Dirichlet rows (1: uniform on the simplex)
    token_weight_scale: float = 0.5  # std of the gold per-token weights w, small next to the "!" bonus
    bang_bonus: float = 3.0  # b: gold reward of the first "!"
    bang_penalty: float = 1.5  # c: gold cost of each further "!", so one "!" is the best count
    repeat_penalty: float = 0.5  # rho: gold cost of each pair of equal neighbours; the proxy cannot see it
    label_temperature: float = 2.0  # tau in P(a > b) = sigmoid((r_a - r_b) / tau): 2 makes the labels noisy
    label_flip: float = 0.0  # probability of flipping each label after drawing it
    # lambda of the N(0, 1/lambda) prior on the proxy weights: worth 10 pseudo-observations, so that
    # with few pairs it splits the first "!"'s bonus between the "!" count and the "has a !" feature.
    prior_precision: float = 10.0

    def __post_init__(self) -> None:
        check_field(self, "n_pairs",
                    "the proxy is fitted to at least one preference pair", low=1, integer=True)
        check_field(self, "bang_prob",
                    'it is the probability of "!" at every position of the reference chain '
                    "(the default 0.08 makes it rare)", low=0, low_open=True, high=1, high_open=True)
        check_field(self, "dirichlet_alpha", "it is a Dirichlet concentration (1 draws the chain's rows "
                    "uniformly from the simplex)", low=0, low_open=True)
        for name in ("token_weight_scale", "bang_bonus", "bang_penalty", "repeat_penalty"):
            check_field(self, name, "it is a size, the sign is fixed by the gold reward's formula; "
                        "0 switches this term off", low=0)
        check_field(self, "label_temperature",
                    "it divides the gold reward difference in the labels' logistic "
                    "(larger: noisier labels)", low=0, low_open=True)
        check_field(self, "label_flip",
                    "it is the probability of flipping a label; at 0.5 the labels carry no "
                    "information", low=0, high=0.5, high_open=True)
        check_field(self, "prior_precision", "it is the precision of the Gaussian prior on the proxy weights "
                    "(larger: weights nearer 0)", low=0, low_open=True)


@dataclass(frozen=True)
class TrainConfig:
    """One training run of :func:`~kltutorial.toyrlhf.train_policy` (REINFORCE with a per-token KL penalty).

    Examples
    --------
    >>> TrainConfig(beta=0.5).steps
    400
    >>> TrainConfig(beta=0.5, batch_size=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: TrainConfig.batch_size must be an int >= 2, got 1: the leave-one-out baseline averages ...
    """

    # A fixed KL coefficient beta, or None when a controller passed to train_policy sets beta at every step.
    beta: float | None = None
    # Enough for every beta in [0.1, 1] to end within 0.05 nats of the exact optimum pi*_beta (section 11
    # measures it); the learning rate decays linearly to 0 over the second half.
    steps: int = 400
    batch_size: int = 2048  # B, sequences sampled per step
    lr: float = 0.1  # Adam's step on the table of logit offsets (one row per prefix)
    # Floor of the critic's step size: at first each prefix's value is the running mean of its returns,
    # then an exponential average with this weight, so that it follows the policy as the policy moves.
    critic_min_step: float = 0.2

    def __post_init__(self) -> None:
        if self.beta is not None:
            check_field(self, "beta",
                        "it is the fixed KL coefficient (section 11 uses 0.1 to 1); leave it None "
                        "only when a controller sets beta", low=0, low_open=True)
        check_field(self, "steps", "the number of training steps (the default is 400)", low=1, integer=True)
        check_field(self, "batch_size",
                    "the leave-one-out baseline averages the other sequences of the batch "
                    "(the default is 2048)", low=2, integer=True)
        check_field(self, "lr", "it is Adam's learning rate (the default is 0.1)", low=0, low_open=True)
        check_field(self, "critic_min_step",
                    "it is the smallest weight of a new batch in the critic's running "
                    "average (the default is 0.2)", low=0, low_open=True, high=1)
