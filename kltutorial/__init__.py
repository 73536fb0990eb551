"""kltutorial: the code behind the book *The KL Penalty in RLHF*.

Every number and figure in the book comes from this package; the notebooks import it and never
re-implement it. The package is three layers, and an import only ever points down them:

**The library**, what a trainer imports (it imports nothing but itself):

====================  ====================================================  ========
module                what it holds                                         sections
====================  ====================================================  ========
``logprobs``          log-probs of chosen tokens; exact per-position KL     8, 12
                      (``logprobs.hidden``: both, and the entropy, from
                      the last hidden states, tile by tile, and over a
                      vocabulary split across processes)
``estimators``        registry of KL estimators; masking, reduction         4, 8, 9
``objective``         per-token reward shaping; the penalised objective     5, 8
``controllers``       fixed, proportional, doubling, exponential beta       7, 8
``monitoring``        what to log at every step (k1, k3, their standard     12
                      errors, signs, entropy); KL spike detection
``compat``            the peers' names and signatures (``compat.trl``,      8
                      ``.verl``, ``.openrlhf``) over the library's code
``_validation``       the input checks every public function shares         all
====================  ====================================================  ========

**The exact maths** (:mod:`kltutorial.exact`, imports only the library): divergences of categoricals
and Gaussians (§1, §2); listable sequence spaces, where every KL, expectation and :math:`\\pi^*_\\beta` is a
finite sum (§3, §5, §11); the per-token fixed points of each recipe (§9); exact expected gradients
(``exact.gradients``, §4) and the KL in the reward or in the loss (``exact.placement``, §9).

**The book's studies and tools**, built on both:

====================  ====================================================  ========
``studies``           one module per section's measurement: ``estimation``  4-12
                      (§4), ``beta_scale`` and ``reference_cost`` (§6),
                      ``control`` (§7), ``dynamics`` (§10),
                      ``scaling_fit`` (§11), ``diagnostics``, ``bench``,
                      ``bench_simulation`` (§12)
``toyrlhf``           a real RLHF run on an enumerable output space, its    9, 11
                      recipes (PPO, RLOO, GRPO variants) and a transformer
                      policy (``python -m kltutorial.toyrlhf``)
``textrlhf``          a small language model on real English (quotes from   -
                      installed packages), VADER's gold reward, REINFORCE
                      with k1 in the reward, the per-word KL
                      (``python -m kltutorial.textrlhf``); its chapter is
                      to come
``plotting``          the book's figures: one style module, one module      all
                      per family of figures
``book``              source listings; ``glue``/``glued``: prose numbers    all
``exercises``         the code exercises' checkers: ``check("k3", f)``      2, 4, 5
                      runs a reader's function against the package
====================  ====================================================  ========

Shape vocabulary used in every docstring: ``B`` batch, ``T`` tokens (positions), ``V`` vocabulary,
``N`` samples. KL is in nats throughout. One name per quantity: ``beta`` (the libraries' ``kl_coef``,
``init_kl_coef``), ``target_kl`` (their ``target``), ``horizon``, ``n_steps``; the libraries' own
spellings are in ``compat``.
"""

from .controllers import (
    AdaptiveKLController,
    ControllerHistory,
    DoublingKLController,
    ExponentialKLController,
    FixedKLController,
    KLController,
)
from .estimators import (
    ESTIMATOR_ALIASES,
    ESTIMATORS,
    compute_token_kl,
    get_estimator,
    kl_estimate,
    register_estimator,
)
from .logprobs import exact_kl, get_logprobs_for_tokens
from .logprobs.hidden import linear_exact_kl, linear_logprobs
from .objective import compute_rlhf_objective, shape_rewards

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_ALIASES",
    "AdaptiveKLController",
    "ControllerHistory",
    "DoublingKLController",
    "ExponentialKLController",
    "FixedKLController",
    "KLController",
    "compute_rlhf_objective",
    "compute_token_kl",
    "exact_kl",
    "get_estimator",
    "get_logprobs_for_tokens",
    "kl_estimate",
    "linear_exact_kl",
    "linear_logprobs",
    "register_estimator",
    "shape_rewards",
]

__version__ = "0.1.0"
