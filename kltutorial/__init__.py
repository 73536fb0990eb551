"""kltutorial: the code behind the book *The KL Penalty in RLHF*.

Every number and figure in the book comes from this package; the notebooks import it and never
re-implement it. One concept per module:

====================  ====================================================  ========
module                what it holds                                         sections
====================  ====================================================  ========
``divergences``       KL, entropy, cross-entropy of categoricals; Gaussian  1, 2
                      fits by forward and reverse KL
``logprobs``          log-probs of chosen tokens; exact per-position KL     8, 12
``estimators``        registry of KL estimators; masking, reduction         4, 8, 9
``estimation``        bias, spread and sign of the estimators (Gaussians)   4
``gradients``         exact expected gradients of each estimator as a loss  4, 9
``objective``         per-token reward shaping; the penalised objective     5, 8
``placement``         KL in the reward (then GAE) or in the loss, exactly   9
``controllers``       fixed, proportional, doubling, exponential beta       7, 8
``compat``            the peers' signatures (``compat.trl``, ``.verl``,     8
                      ``.openrlhf``) over the package's code
``control_study``     step response, gain and settling of the controllers   7
``beta_scale``        reward scale, sum vs token-mean targets, sweeps       6
``reference_cost``    reference log-probs reused; LoRA's disabled adapter   6
``sequences``         exact maths of a listable sequence space: chain       3, 5, 11
                      rule, estimates, pi*_beta, frontier, best-of-n
``simulate``          the (invented) training-dynamics models of §10        10
``patterns``          hand-made per-token KL curves of §10                  10
``toyrlhf``           a real RLHF run on an enumerable output space         11
``scaling_fit``       Gao et al.'s functional forms fitted to the frontier  11
``diagnostics``       negative-KL causes, spike detection, what to log      12
``plotting``          the book's figures: one style module, one module      all
                      per family of figures
``bench``             memory/time benchmark of the log-prob kernels         12
``bench_simulation``  the vectorised §10 model against a scalar loop        12
``display``           source listings; ``glue``/``glued``: prose numbers    all
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
    "register_estimator",
    "shape_rewards",
]

__version__ = "0.1.0"
