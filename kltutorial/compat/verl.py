"""verl's names over the package's code: the KL controllers of ``verl/trainer/ppo/core_algos.py``.

``AdaptiveKLController(init_kl_coef, target_kl, horizon)`` with ``update(current_kl, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value`` and the adaptive one its target
in ``.target``, as verl's do. See
:mod:`kltutorial.compat` for what differs on purpose.

Examples
--------
>>> from kltutorial.compat import verl
>>> ctl = verl.AdaptiveKLController(init_kl_coef=0.001, target_kl=0.1, horizon=10000)
>>> ctl.update(current_kl=0.05, n_steps=1024)
>>> round(ctl.value, 10), ctl.target  # 0.001 * (1 - 0.2 * 1024 / 10000)
(0.00097952, 0.1)
"""

from __future__ import annotations

import torch

from ._controllers import PeerAdaptiveKLController, PeerFixedKLController
from ._kl import sampled_penalty

__all__ = ["AdaptiveKLController", "FixedKLController", "kl_penalty", "kl_penalty_forward"]

_FORWARD = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


class AdaptiveKLController(PeerAdaptiveKLController):
    """verl's ``AdaptiveKLController(init_kl_coef, target_kl, horizon)``; ``update(current_kl, n_steps)``."""

    _target_name, _kl_name = "target_kl", "current_kl"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        super().__init__(init_kl_coef, target_kl, horizon)

    def __repr__(self) -> str:
        return (f"AdaptiveKLController(init_kl_coef={self._betas[0]!r}, target_kl={self.target_kl!r}, "
                f"horizon={self.horizon!r})")

    def update(self, current_kl: float, n_steps: int) -> None:  # type: ignore[override]
        """Observe the KL measured with ``.value`` over ``n_steps`` samples; ``.value`` moves."""
        super().update(current_kl, n_steps)


class FixedKLController(PeerFixedKLController):
    """verl's ``FixedKLController(kl_coef)``; ``update(current_kl, n_steps)`` changes nothing."""

    _kl_name = "current_kl"

    def update(self, current_kl: float, n_steps: int) -> None:  # type: ignore[override]
        """Record the KL; the coefficient does not change."""
        super().update(current_kl, n_steps)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """verl's ``kl_penalty``: the estimate named by ``kl_penalty``, any of ``kl``/``k1``, ``abs``,
    ``mse``/``k2``, ``low_var_kl``/``k3``, each also with a ``+`` suffix (straight-through: its value, the
    gradient of k2); ``"full"`` and other names raise ``NotImplementedError``, as verl's does.

    Examples
    --------
    >>> lp, ref = torch.tensor([-1.0, -30.0]), torch.tensor([-1.5, -0.5])
    >>> kl_penalty(lp, ref, "low_var_kl")  # the second clamped to 10, as verl's
    tensor([ 0.1065, 10.0000])
    """
    names = _FORWARD + tuple(f"{n}+" for n in _FORWARD)
    return sampled_penalty(logprob, ref_logprob, kl_penalty, allowed=names, library="verl's kl_penalty")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """verl's ``kl_penalty_forward``: the plain names only (no ``+``), with the same clamps."""
    return sampled_penalty(logprob, ref_logprob, kl_penalty, allowed=_FORWARD,
                           library="verl's kl_penalty_forward")
