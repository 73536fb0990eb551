"""The peers' KL controllers as thin subclasses of :mod:`kltutorial.controllers` (shared by the three
compat modules, which differ only in the names of the target and of the KL)."""

from __future__ import annotations

from .. import controllers
from .._validation import check_coef, check_positive, check_real

__all__ = ["PeerAdaptiveKLController", "PeerFixedKLController"]


class PeerAdaptiveKLController(controllers.AdaptiveKLController):
    """``AdaptiveKLController(init_kl_coef, target, horizon)``: Ziegler et al.'s rule, the peers' way.

    ``update(current, n_steps)`` returns ``None``; ``.value`` is the coefficient, ``.target`` the target KL
    and ``.horizon`` the horizon, as in TRL (<= 0.11), OpenRLHF and verl. The one difference on purpose:
    the update's factor is floored at :data:`~kltutorial.controllers.MIN_FACTOR`, so β never turns
    negative when ``n_steps`` exceeds five horizons (theirs does; see
    :class:`~kltutorial.controllers.AdaptiveKLController`), and bad input raises instead of dividing by
    zero. Everywhere else the coefficients are theirs, bit for bit.
    """

    _target_name = "target"  # verl's is target_kl
    _kl_name = "current"  # verl's is current_kl

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        # checked under the peers' names, so that an error names the argument the caller wrote
        super().__init__(beta=check_positive(init_kl_coef, "init_kl_coef"),
                         target_kl=check_positive(target, self._target_name), horizon=horizon)

    @property
    def target(self) -> float:
        """The target KL (the library's ``target_kl``)."""
        return self.target_kl

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(init_kl_coef={self._betas[0]!r}, target={self.target_kl!r}, "
                f"horizon={self.horizon!r})")

    def update(self, current: float, n_steps: int) -> None:  # type: ignore[override]
        """Observe the KL measured with ``.value`` over ``n_steps`` samples; ``.value`` moves."""
        super().update(check_real(current, self._kl_name), n_steps)


class PeerFixedKLController(controllers.FixedKLController):
    """``FixedKLController(kl_coef)``: ``.value`` stays ``kl_coef`` unless set; ``update`` gives ``None``."""

    _kl_name = "current"

    def __init__(self, kl_coef: float) -> None:
        super().__init__(beta=check_coef(kl_coef, "kl_coef"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kl_coef={self._betas[0]!r})"

    def update(self, current: float, n_steps: int) -> None:  # type: ignore[override]
        """Record the KL; the coefficient does not change."""
        super().update(check_real(current, self._kl_name), n_steps)
