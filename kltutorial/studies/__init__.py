"""The book's studies: one module per section's measurement, built on the library and :mod:`kltutorial.exact`.

Nothing in the library or in ``exact`` imports from here. A study may import another (the §7 control
study runs the §10 dynamics' plant), and each is imported by its module name:

======================  ==============================================================  ========
module                  what it measures                                                section
======================  ==============================================================  ========
``estimation``          bias, spread and sign of the KL estimators (Gaussians)          4
``beta_scale``          reward scale, sum vs token-mean targets, β sweeps               6
``reference_cost``      reference log-probs reused; LoRA's disabled adapter             6
``control``             step response, gain and settling of the KL controllers          7
``dynamics``            the (invented) training-dynamics models and per-token KL        10
                        patterns
``scaling_fit``         Gao et al.'s functional forms fitted to the frontier            11
``diagnostics``         the log line's exact expectation; samplers that are not the     12
                        policy; where the KL sits along a sequence
``bench``               memory/time benchmark of the log-prob kernels                   12
                        (``python -m kltutorial.studies.bench``)
``bench_simulation``    the vectorised §10 model against a one-run-at-a-time loop       12
``trl_runs``            TRL's GRPOTrainer and RLOOTrainer against their fixed points    9
                        (``python -m kltutorial.studies.trl_runs``)
======================  ==============================================================  ========
"""
