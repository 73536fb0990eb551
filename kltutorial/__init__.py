"""kltutorial: the code behind the book *The KL Penalty in RLHF*.

Every number and figure in the book comes from this package; the notebooks import it and never
re-implement it. One concept per module:

==========================  ==================================================  =========
module                      what it holds                                       sections
==========================  ==================================================  =========
``logprobs``                log-probs of chosen tokens; exact per-position KL   8, 12
``estimators``              registry of KL estimators; masking, reduction       4, 8, 9
``objective``               per-token reward shaping; the penalised objective   5, 8
``controllers``             fixed, proportional, doubling, exponential beta     7, 8
``sequences``               exact maths of a listable sequence space: chain     3, 5, 11
                            rule, pi*_beta and its frontier, best-of-n
``simulate``                the (invented) training-dynamics models of §10      10
``patterns``                hand-made per-token KL curves of §10                10
``toyrlhf``                 a real RLHF run on an enumerable output space       11
``plotting``                the book's figures: one style module, one module    all
                            per family of figures
``bench``                   memory/time benchmark of the log-prob kernels       12
``bench_simulation``        the vectorised §10 model against a scalar loop      12
``display``                 shows the package's own source on a page            all
==========================  ==================================================  =========

Shape vocabulary used in every docstring: ``B`` batch, ``T`` tokens (positions), ``V`` vocabulary,
``N`` samples. KL is in nats throughout.
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
