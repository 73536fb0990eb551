r"""One-dimensional Gaussians and Gaussian mixtures: the closed-form KL, KL by quadrature on a fixed
grid, and the forward and reverse fits of one Gaussian to a mixture (book section 2).

The package's introduction to the KL divergence is in :mod:`kltutorial.exact`. Everything is in
float64 and deterministic: the quadrature grid is fixed, and the reverse fit (L-BFGS, then Newton steps)
starts where it is told.

References: C. M. Bishop, *Pattern Recognition and Machine Learning* (2006), §10.1.2 (Figure 10.3) and
§10.7 (moment matching); T. Minka, "Divergence measures and message passing", MSR-TR-2005-173 (2005).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_choice, check_positive, check_positive_int, check_real

__all__ = [
    "Gaussian",
    "GaussianMixture",
    "kl_gaussians",
    "kl_quadrature",
    "fit_forward_kl",
    "fit_reverse_kl",
    "kl_profile",
    "GRID_POINTS",
    "GRID_HALF_WIDTH",
]

# The fixed quadrature grid, in standard deviations of the distribution integrated over: 4001 points on
# [-12, 12] (spacing 0.006). Gauss-Hermite with a few dozen nodes is exact for polynomials but ripples on
# the log-density of a mixture, whose bend between components is narrow: it made spurious local minima.
#: Points of the fixed quadrature grid (the default ``n_points`` of the quadrature and the fits).
GRID_POINTS = 4001
#: Half-width of the grid, in standard deviations of the distribution integrated over.
GRID_HALF_WIDTH = 12.0


def _as_floats(values: object, name: str) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    return tuple(check_real(v, f"{name}[{i}]") for i, v in enumerate(values))


@dataclass(frozen=True)
class Gaussian:
    r"""A normal distribution :math:`\mathcal{N}(\mu, \sigma^2)` on the real line.

    Parameters
    ----------
    mean : float
        :math:`\mu`, finite.
    std : float
        :math:`\sigma > 0`.

    Examples
    --------
    >>> g = Gaussian(0.0, 1.0)
    >>> round(float(g.pdf(0.0)), 4)  # 1 / sqrt(2 pi)
    0.3989
    >>> round(g.entropy, 4)  # (1/2) log(2 pi e)
    1.4189
    """

    mean: float
    std: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", check_real(self.mean, "mean"))
        object.__setattr__(self, "std", check_positive(self.std, "std"))

    def logpdf(self, x: object) -> np.ndarray:
        r""":math:`\log \mathcal{N}(x; \mu, \sigma^2) = -\tfrac12 \log(2\pi\sigma^2)
        - (x-\mu)^2/(2\sigma^2)`."""
        x = np.asarray(x, dtype=np.float64)
        return -0.5 * math.log(2 * math.pi * self.std**2) - (x - self.mean) ** 2 / (2 * self.std**2)

    def pdf(self, x: object) -> np.ndarray:
        """The density at ``x`` (any shape)."""
        return np.exp(self.logpdf(x))

    @property
    def entropy(self) -> float:
        r"""Differential entropy :math:`\tfrac12 \log(2\pi e \sigma^2)` nats."""
        return 0.5 * math.log(2 * math.pi * math.e * self.std**2)


@dataclass(frozen=True)
class GaussianMixture:
    r"""A mixture :math:`p(x) = \sum_k w_k\, \mathcal{N}(x; \mu_k, \sigma_k^2)` on the real line.

    Parameters
    ----------
    weights : sequence of float, length K
        :math:`w_k \ge 0`, summing to 1.
    means : sequence of float, length K
        :math:`\mu_k`.
    stds : sequence of float, length K
        :math:`\sigma_k > 0`.

    Examples
    --------
    >>> p = GaussianMixture(weights=[0.5, 0.5], means=[-1.0, 1.0], stds=[1.0, 1.0])
    >>> p.mean, round(p.std**2, 6)  # sum_k w_k (sigma_k^2 + mu_k^2) - mean^2 = 2
    (0.0, 2.0)
    """

    weights: tuple[float, ...]
    means: tuple[float, ...]
    stds: tuple[float, ...]

    def __post_init__(self) -> None:
        weights = _as_floats(self.weights, "weights")
        means = _as_floats(self.means, "means")
        stds = _as_floats(self.stds, "stds")
        if not len(weights) == len(means) == len(stds) >= 1:
            raise ValueError(
                "weights, means and stds must have the same length >= 1 (one entry per component), got "
                f"{len(weights)}, {len(means)} and {len(stds)}"
            )
        if min(weights) < 0 or abs(sum(weights) - 1.0) > 1e-9:
            raise ValueError(f"weights must be >= 0 and sum to 1, got {weights}")
        if min(stds) <= 0:
            raise ValueError(f"stds must be > 0, got {stds}")
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "stds", stds)

    @classmethod
    def of(cls, gaussian: Gaussian) -> GaussianMixture:
        """The one-component mixture equal to ``gaussian``."""
        if not isinstance(gaussian, Gaussian):
            raise TypeError(f"gaussian must be a Gaussian, got {type(gaussian).__name__}")
        return cls(weights=(1.0,), means=(gaussian.mean,), stds=(gaussian.std,))

    def logpdf(self, x: object) -> np.ndarray:
        r""":math:`\log p(x) = \log \sum_k w_k \mathcal{N}(x; \mu_k, \sigma_k^2)`, by log-sum-exp."""
        x = np.asarray(x, dtype=np.float64)
        out = np.full(x.shape, -np.inf)
        for w, mu, sd in zip(self.weights, self.means, self.stds, strict=True):
            if w > 0:  # a component of weight 0 adds log 0 = -inf
                log_comp = math.log(w) - 0.5 * math.log(2 * math.pi * sd**2) - (x - mu) ** 2 / (2 * sd**2)
                out = np.logaddexp(out, log_comp)  # log(e^out + e^log_comp), without overflow
        return out

    def pdf(self, x: object) -> np.ndarray:
        """The density at ``x`` (any shape)."""
        return np.exp(self.logpdf(x))

    @property
    def mean(self) -> float:
        r""":math:`\mathbb{E}_p[x] = \sum_k w_k \mu_k`."""
        return float(np.dot(self.weights, self.means))

    @property
    def std(self) -> float:
        r""":math:`\sqrt{\mathrm{Var}_p[x]}`, with :math:`\mathrm{Var}_p[x] = \sum_k w_k(\sigma_k^2 + \mu_k^2)
        - \mathbb{E}_p[x]^2`."""
        w, mu, sd = (np.asarray(a) for a in (self.weights, self.means, self.stds))
        return float(math.sqrt(max(float(np.dot(w, sd**2 + mu**2)) - self.mean**2, 0.0)))


def _as_mixture(d: object, name: str) -> GaussianMixture:
    if isinstance(d, Gaussian):
        return GaussianMixture.of(d)
    if isinstance(d, GaussianMixture):
        return d
    raise TypeError(f"{name} must be a Gaussian or a GaussianMixture, got {type(d).__name__}")


def kl_gaussians(p: Gaussian, q: Gaussian) -> float:
    r"""Closed form :math:`\mathrm{KL}(\mathcal{N}(\mu_p, \sigma_p^2) \| \mathcal{N}(\mu_q, \sigma_q^2))
    = \log\frac{\sigma_q}{\sigma_p} + \frac{\sigma_p^2 + (\mu_p - \mu_q)^2}{2\sigma_q^2} - \frac12` nats.

    Parameters
    ----------
    p, q : Gaussian

    Returns
    -------
    float

    Examples
    --------
    >>> kl_gaussians(Gaussian(0.0, 1.0), Gaussian(1.0, 1.0))  # (mu_p - mu_q)^2 / 2 for equal widths
    0.5
    >>> round(kl_gaussians(Gaussian(0.0, 1.0), Gaussian(0.0, 2.0)), 4)  # log 2 + 1/8 - 1/2
    0.3181
    """
    for d, name in ((p, "p"), (q, "q")):
        if not isinstance(d, Gaussian):
            raise TypeError(f"{name} must be a Gaussian, got {type(d).__name__}")
    return (
        math.log(q.std / p.std) + (p.std**2 + (p.mean - q.mean) ** 2) / (2 * q.std**2) - 0.5
    )


def _check_n_points(n_points: object) -> int:
    n = check_positive_int(n_points, "n_points")
    if n < 3:
        raise ValueError(f"n_points must be >= 3 (points of the trapezoid grid, default 4001), got {n}")
    return n


def _normal_grid(n_points: int) -> tuple[np.ndarray, np.ndarray]:
    r"""A fixed grid for :math:`\mathbb{E}_{Z\sim\mathcal{N}(0,1)}[f(Z)] \approx \sum_i v_i f(z_i)`: the
    trapezoid rule on ``n_points`` equally spaced :math:`z_i \in [-12, 12]`, :math:`v_i = h\,\varphi(z_i)`.

    For a smooth integrand that decays like :math:`\varphi`, the trapezoid rule on the whole line converges
    exponentially in :math:`1/h`, and the mass beyond 12 standard deviations is below 1e-32; with the
    default 4001 points (:math:`h = 0.006`) a Gaussian's moments come out exact to rounding, and the
    log-density of a mixture, which bends sharply where one component takes over from another, is
    resolved for components down to a width of about :math:`0.05\,\sigma`.
    """
    z = np.linspace(-GRID_HALF_WIDTH, GRID_HALF_WIDTH, n_points)
    h = z[1] - z[0]
    return z, h * np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)


def _kl_quadrature(p: GaussianMixture, q: GaussianMixture, n_points: int) -> float:
    z, v = _normal_grid(n_points)
    total = 0.0
    for w, mu, sd in zip(p.weights, p.means, p.stds, strict=True):
        if w == 0:
            continue
        x = mu + sd * z  # (n_points,): the nodes for E over the k-th component of p
        total += w * float(np.dot(v, p.logpdf(x) - q.logpdf(x)))
    return total


def kl_quadrature(
    p: Gaussian | GaussianMixture, q: Gaussian | GaussianMixture, n_points: int = GRID_POINTS
) -> float:
    r""":math:`\mathrm{KL}(p \| q) = \sum_k w_k\, \mathbb{E}_{x \sim \mathcal{N}(\mu_k, \sigma_k^2)}
    [\log p(x) - \log q(x)]`, each expectation by the trapezoid rule on a fixed grid.

    The grid is ``n_points`` equally spaced points over :math:`\mu_k \pm 12\,\sigma_k` for each
    component of :math:`p`. The trapezoid rule converges exponentially for smooth integrands that decay
    like a Gaussian: for two Gaussians (a quadratic :math:`\log p - \log q`) the result equals the closed
    form :func:`kl_gaussians` to rounding. The grid is fixed, so the result is deterministic.

    Parameters
    ----------
    p, q : Gaussian or GaussianMixture
    n_points : int
        Grid points per component of ``p``, >= 3 (default 4001).

    Returns
    -------
    float
        Nats.

    Examples
    --------
    >>> round(kl_quadrature(Gaussian(0.0, 1.0), Gaussian(1.0, 1.0)), 12)  # the closed form is 1/2
    0.5
    """
    p_mix, q_mix = _as_mixture(p, "p"), _as_mixture(q, "q")
    return _kl_quadrature(p_mix, q_mix, _check_n_points(n_points))


def fit_forward_kl(p: Gaussian | GaussianMixture) -> Gaussian:
    r"""The Gaussian :math:`q` that minimises the forward KL, :math:`\arg\min_q \mathrm{KL}(p \| q)`:
    moment matching, :math:`\mu_q = \mathbb{E}_p[x]`, :math:`\sigma_q^2 = \mathrm{Var}_p[x]`.

    Why: :math:`\mathrm{KL}(p \| q) = -H(p) - \mathbb{E}_p[\log q]`, and for a Gaussian :math:`q`,
    :math:`-\mathbb{E}_p[\log q] = \tfrac12\log(2\pi\sigma_q^2) + \mathbb{E}_p[(x-\mu_q)^2] / (2\sigma_q^2)`,
    smallest at the mean and variance of :math:`p` (Bishop 2006, §10.7). The fit is *mass-covering*: the
    KL is large wherever :math:`p` has mass and :math:`q` has little, so :math:`q` stretches over every
    mode of :math:`p`, and puts mass between them where :math:`p` has none.

    Parameters
    ----------
    p : Gaussian or GaussianMixture

    Returns
    -------
    Gaussian

    Examples
    --------
    >>> fit_forward_kl(GaussianMixture([0.5, 0.5], [-1.0, 1.0], [1.0, 1.0]))
    Gaussian(mean=0.0, std=1.4142135623730951)
    """
    p_mix = _as_mixture(p, "p")
    return Gaussian(p_mix.mean, p_mix.std)


def _reverse_objective(p: GaussianMixture, mean: torch.Tensor, log_std: torch.Tensor, z: torch.Tensor,
                       v: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm{KL}(q \| p) = -H(q) - \mathbb{E}_q[\log p]` for :math:`q = \mathcal{N}(\mu, e^{2s})`,
    differentiable in :math:`(\mu, s)`; the expectation on the fixed standardised grid ``z``."""
    w = torch.tensor(p.weights, dtype=torch.float64)
    mu = torch.tensor(p.means, dtype=torch.float64)
    sd = torch.tensor(p.stds, dtype=torch.float64)
    x = mean + torch.exp(log_std) * z  # (n_points,)
    comp = torch.log(w) - 0.5 * torch.log(2 * math.pi * sd**2) - (x[:, None] - mu) ** 2 / (2 * sd**2)
    log_p = torch.logsumexp(comp, dim=-1)  # (n_points,)
    entropy_q = 0.5 * math.log(2 * math.pi * math.e) + log_std
    return -entropy_q - (v * log_p).sum()


def _minimise_reverse(p: GaussianMixture, mean: float, std: float, fit_mean: bool, n_points: int,
                      tol: float) -> tuple[float, float]:
    """Minimise KL(q || p) over (mean, log std), or over log std alone; returns (mean, std).

    1. L-BFGS with a strong-Wolfe line search brings the point into the basin of a minimum. Its line
       search compares losses, so it stalls once the loss changes by less than the float64 rounding of
       the loss, with a gradient near 1e-8.
    2. Newton steps on the gradient (exact Hessian by autograd) then take the gradient down to ``tol``,
       as long as the Hessian is positive definite (a minimum, not a saddle).
    Deterministic: fixed grid, fixed start, no randomness.
    """
    z_np, v_np = _normal_grid(n_points)
    z, v = torch.tensor(z_np), torch.tensor(v_np)
    m = torch.tensor(mean, dtype=torch.float64, requires_grad=fit_mean)
    s = torch.tensor(math.log(std), dtype=torch.float64, requires_grad=True)
    params = [m, s] if fit_mean else [s]
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=500, tolerance_grad=tol, tolerance_change=0.0,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _reverse_objective(p, m, s, z, v)
        loss.backward()
        return loss

    opt.step(closure)  # 1.
    worst = math.inf
    for _ in range(20):  # 2.
        grads = torch.autograd.grad(_reverse_objective(p, m, s, z, v), params, create_graph=True)
        g = torch.stack(grads).detach()
        worst = float(g.abs().max())
        if worst <= tol:
            break
        hess = torch.stack([torch.stack(torch.autograd.grad(gi, params, retain_graph=True)) for gi in grads])
        if not bool(torch.all(torch.linalg.eigvalsh(hess) > 0)):
            break
        step = torch.linalg.solve(hess, g)
        with torch.no_grad():
            for x, dx in zip(params, step, strict=True):
                x -= dx
    if not worst <= tol:
        raise RuntimeError(f"the reverse-KL fit did not converge: gradient {worst:.3g} > tol = {tol:g} "
                           "(a saddle or a flat start); try another start")
    return float(m.detach()), float(torch.exp(s.detach()))


def fit_reverse_kl(p: Gaussian | GaussianMixture, init: Gaussian, n_points: int = GRID_POINTS,
                   tol: float = 1e-10) -> Gaussian:
    r"""A Gaussian :math:`q` at a local minimum of the reverse KL, :math:`\mathrm{KL}(q \| p)`, found by
    optimisation from ``init``.

    The objective is :math:`\mathrm{KL}(q \| p) = -H(q) - \mathbb{E}_q[\log p]`, with
    :math:`H(q) = \tfrac12 \log(2\pi e \sigma^2)` exact and :math:`\mathbb{E}_q[\log p] = \sum_i v_i
    \log p(\mu + \sigma z_i)` on the fixed grid of :func:`kl_quadrature`, minimised over :math:`(\mu,
    \log\sigma)` in float64 by L-BFGS and then Newton steps. The fit is *mode-seeking*: the KL grows
    without bound as :math:`q` puts mass where :math:`p` has almost none, so :math:`q` settles inside a mode
    of :math:`p`, while the mass of :math:`p` that :math:`q` leaves out costs little (about
    :math:`-\log w_k` for a :math:`q` equal to the k-th component). The objective is not convex: on a
    mixture with separated modes each mode is a local minimum (Bishop 2006, Figure 10.3), a wide Gaussian
    over several modes can be one too, and the start decides which is found.

    Parameters
    ----------
    p : Gaussian or GaussianMixture
    init : Gaussian
        The start of the optimisation.
    n_points : int
        Points of the quadrature grid, >= 3.
    tol : float
        Stop when every partial derivative is below ``tol`` (> 0).

    Returns
    -------
    Gaussian

    Raises
    ------
    RuntimeError
        If the gradient cannot be brought below ``tol`` (the optimiser stopped at a saddle).

    Examples
    --------
    A Gaussian is its own best fit:

    >>> q = fit_reverse_kl(Gaussian(1.0, 2.0), init=Gaussian(0.0, 1.0))
    >>> round(q.mean, 6), round(q.std, 6)
    (1.0, 2.0)
    """
    p_mix = _as_mixture(p, "p")
    if not isinstance(init, Gaussian):
        raise TypeError(f"init must be a Gaussian (the start), got {type(init).__name__}")
    n_points = _check_n_points(n_points)
    tol = check_positive(tol, "tol")
    mean, std = _minimise_reverse(p_mix, init.mean, init.std, True, n_points, tol)
    return Gaussian(mean, std)


def kl_profile(p: Gaussian | GaussianMixture, means: object, direction: str, n_stds: int = 200,
               n_points: int = GRID_POINTS) -> tuple[np.ndarray, np.ndarray]:
    r"""Each KL between :math:`p` and the Gaussian :math:`q = \mathcal{N}(\mu, \sigma^2)` as a function of
    :math:`\mu`, with :math:`\sigma` chosen best for each :math:`\mu`.

    ``direction="forward"``: :math:`\min_\sigma \mathrm{KL}(p \| q)`, at :math:`\sigma^2 = \mathbb{E}_p[(x -
    \mu)^2]` (closed form); a single minimum, at the mean of :math:`p`. ``direction="reverse"``:
    :math:`\min_\sigma \mathrm{KL}(q \| p)`, the smallest value over ``n_stds`` widths spaced
    geometrically from a quarter of the narrowest component's to twice the width of :math:`p` (a grid,
    so that for each :math:`\mu` the best width is found even where two widths are both local minima); a
    local minimum near each well-separated mode of :math:`p`.

    Parameters
    ----------
    p : Gaussian or GaussianMixture
    means : array_like, shape (M,)
        Values of :math:`\mu`, finite.
    direction : {"forward", "reverse"}
    n_stds : int
        Widths tried for ``"reverse"``, >= 2.
    n_points : int
        Points of the quadrature grid, >= 3.

    Returns
    -------
    kl : ndarray, shape (M,)
        Nats.
    std : ndarray, shape (M,)
        The best :math:`\sigma` for each mean.

    Examples
    --------
    >>> p = Gaussian(0.0, 1.0)
    >>> kl, std = kl_profile(p, [0.0, 1.0], "forward")  # sigma^2 = 1 + mu^2
    >>> kl.round(4), std.round(4)
    (array([0.    , 0.3466]), array([1.    , 1.4142]))
    >>> kl, std = kl_profile(p, [0.0, 1.0], "reverse")  # sigma = 1 and KL = mu^2 / 2, up to the grid
    >>> kl.round(4), std.round(2)
    (array([0. , 0.5]), array([1., 1.]))
    """
    p_mix = _as_mixture(p, "p")
    check_choice(direction, "direction", ("forward", "reverse"))
    n_points = _check_n_points(n_points)
    n_stds = check_positive_int(n_stds, "n_stds")
    if n_stds < 2:
        raise ValueError(f"n_stds must be >= 2 (widths on a grid), got {n_stds}")
    try:
        mus = np.asarray(means, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"means must be an array of numbers, got {type(means).__name__}") from None
    if mus.size == 0 or not np.all(np.isfinite(mus)):
        raise ValueError("means must be a non-empty array of finite numbers")
    if direction == "forward":
        std = np.sqrt(p_mix.std**2 + (p_mix.mean - mus) ** 2)  # E_p[(x - mu)^2]
        kl = np.array([_kl_quadrature(p_mix, GaussianMixture.of(Gaussian(m, s)), n_points)
                       for m, s in zip(mus, std, strict=True)])
        return kl, std
    z, v = _normal_grid(n_points)
    widths = np.geomspace(min(p_mix.stds) / 4, 2 * p_mix.std, n_stds)  # (S,)
    entropy_q = 0.5 * np.log(2 * np.pi * np.e * widths**2)  # (S,)
    kl, std = np.empty_like(mus), np.empty_like(mus)
    for i, mu in enumerate(mus):
        x = mu + widths[:, None] * z  # (S, n_points)
        reverse = -entropy_q - p_mix.logpdf(x) @ v  # (S,): KL(q || p) = -H(q) - E_q[log p]
        best = int(np.argmin(reverse))
        kl[i], std[i] = reverse[best], widths[best]
    return kl, std

