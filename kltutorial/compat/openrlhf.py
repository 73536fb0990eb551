"""OpenRLHF's names over the package's code: the KL controllers of
``openrlhf/trainer/ppo_utils/kl_controller.py`` (v0.11).

``AdaptiveKLController(init_kl_coef, target, horizon)`` with ``update(current, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value``. See
:mod:`kltutorial.compat` for what differs on purpose.

Examples
--------
>>> from kltutorial.compat import openrlhf
>>> ctl = openrlhf.FixedKLController(kl_coef=0.01)
>>> ctl.update(current=3.0, n_steps=128)
>>> ctl.value
0.01
"""

from __future__ import annotations

from ._controllers import PeerAdaptiveKLController, PeerFixedKLController

__all__ = ["AdaptiveKLController", "FixedKLController"]


class AdaptiveKLController(PeerAdaptiveKLController):
    """OpenRLHF's ``AdaptiveKLController(init_kl_coef, target, horizon)``; ``update(current, n_steps)``."""


class FixedKLController(PeerFixedKLController):
    """OpenRLHF's ``FixedKLController(kl_coef)``; ``update(current, n_steps)`` changes nothing."""
