"""The peers' signatures over the package's own rules: ``compat.trl``, ``compat.verl``, ``compat.openrlhf``.

The library speaks one vocabulary (``beta``, ``target_kl``, ``horizon``, ``n_steps``); TRL, verl and
OpenRLHF each spell the same things their own way. A module here gives one library's names, signatures and
return conventions, computed by the package's code, so that code written against that library runs with
only its import changed. What differs on purpose is said in each docstring; the rules themselves are
:mod:`kltutorial.controllers`'.

So far: the KL penalties and reward shaping of TRL (v0.11.4: ``kl_penalty``, ``compute_rewards``),
verl (``kl_penalty``, ``kl_penalty_forward``, with its clamps and ``+`` names) and OpenRLHF (v0.11.0:
``compute_approx_kl``, ``compute_reward``; ``compute_approx_kl`` also with PR #1309's ``log_probs_old``
and ``unbiased_gradient``), computed by the estimators' ``kl_estimate``; the log-prob and masked-mean
functions, computed by ``kltutorial.logprobs.get_logprobs_for_tokens``:

=============  ==========================================================================================
module         log-probs of chosen tokens; masked mean
=============  ==========================================================================================
``trl``        ``selective_log_softmax(logits, index)``, index (...) or (..., K);
               ``logprobs_from_logits(logits, labels, gather=True)`` (``trl/core.py``, up to v0.11)
``verl``       ``logprobs_from_logits(logits, labels, inplace_backward=True)``,
               ``logprobs_from_logits_v2(logits, labels)``, ``logprobs_from_logits_naive(logits, labels)``;
               ``masked_mean(values, mask, axis=None)``
``openrlhf``   ``log_probs_from_logits(logits, labels, temperature=1.0)``;
               ``masked_mean(tensor, mask, dim=None)``
=============  ==========================================================================================

(log-probs in the logits' dtype, as the libraries return them); and the KL controllers of all three:

=============  ==========================================  =================================
module         ``AdaptiveKLController``                    ``update``
=============  ==========================================  =================================
``trl``        ``(init_kl_coef, target, horizon)``         ``(current, n_steps) -> None``
``verl``       ``(init_kl_coef, target_kl, horizon)``      ``(current_kl, n_steps) -> None``
``openrlhf``   ``(init_kl_coef, target, horizon)``         ``(current, n_steps) -> None``
=============  ==========================================  =================================

and in all three ``FixedKLController(kl_coef)``, whose ``update`` changes nothing; ``.value`` is the
coefficient, readable and settable, and the adaptive one's ``.target`` and ``.horizon`` are readable. Each
class is a subclass of the package's (:class:`~kltutorial.controllers.AdaptiveKLController`,
:class:`~kltutorial.controllers.FixedKLController`), so it also works wherever the package takes a
controller (the toy experiment's ``train_policy`` reads ``.value`` after each ``update``).

**Dtypes.** Every function returns the dtype the library's returns, for every input dtype (checked against
the versions named in each module's docstring): log-probs in the logits' dtype (float64 stays float64),
the KL penalties and reward shaping in the promoted dtype of their inputs, the masked means in the dtype of
the library's expression (verl's is float32 for float16 or bfloat16 values under an integer or boolean
mask), OpenRLHF's ``compute_approx_kl`` in float32 whatever its inputs, as OpenRLHF's. The work is done in
float32, or in float64 where an input is float64, and rounded once to that dtype
(``tests/compat/test_compat_logprobs.py`` and ``test_compat_kl.py`` hold the table).

**What differs on purpose.** Half-precision log-probs are computed in float32 and rounded once to their
dtype (theirs compute in bfloat16 or float16 throughout, so theirs and ours differ in the last bit, ours the
closer to the exact value); the logits are divided by a temperature chunk by chunk, never in place (OpenRLHF
divides the caller's tensor); k3 is computed as ``expm1(-d) + d``, which keeps the digits theirs lose to
cancellation; 0 log 0 = 0 in the full-vocabulary KL (TRL's gives NaN); NaN inputs, ids out of the
vocabulary and an all-zero mask where a mean of nothing would be taken raise instead of propagating. The
controllers' factor is floored at :data:`~kltutorial.controllers.MIN_FACTOR`, so β never turns negative
when ``n_steps`` exceeds five horizons (theirs does), and bad input (a zero or negative target, a NaN KL)
raises a ``ValueError`` that names the argument as the library spells it, where theirs divides by zero or
carries the NaN on. Everywhere else the coefficients are theirs, bit for bit, and the log-probs agree to
rounding (``tests/compat/``, which also runs the peers' own tests of these functions with only the import
changed).
"""

from . import openrlhf, trl, verl

__all__ = ["trl", "verl", "openrlhf"]
