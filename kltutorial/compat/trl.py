"""TRL's names over the package's code: the KL controllers of ``trl/trainer/utils.py`` (v0.11.4).

``AdaptiveKLController(init_kl_coef, target, horizon)`` with ``update(current, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value``. See
:mod:`kltutorial.compat` for what differs on purpose.

Examples
--------
>>> from kltutorial.compat import trl
>>> ctl = trl.AdaptiveKLController(init_kl_coef=0.2, target=6, horizon=10000)
>>> ctl.update(current=9.0, n_steps=256)  # returns None, as TRL's does
>>> round(ctl.value, 8)  # 0.2 * (1 + 0.2 * 256 / 10000)
0.201024
"""

from __future__ import annotations

from ._controllers import PeerAdaptiveKLController, PeerFixedKLController

__all__ = ["AdaptiveKLController", "FixedKLController"]


class AdaptiveKLController(PeerAdaptiveKLController):
    """TRL's ``AdaptiveKLController(init_kl_coef, target, horizon)``; ``update(current, n_steps)``."""


class FixedKLController(PeerFixedKLController):
    """TRL's ``FixedKLController(kl_coef)``; ``update(current, n_steps)`` changes nothing."""
