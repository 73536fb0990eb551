"""The package beside the trainers readers run: each module here imports its trainer's library, and
nothing else in :mod:`kltutorial` imports these modules, so the package works without them.

================  =========================================================================================
``trl``           TRL's ``GRPOTrainer`` and ``RLOOTrainer`` on the toy task of book section 11: a tiny
                  ``transformers`` model and tokenizer built offline, its exact distribution, the proxy
                  reward as a reward function, where each configuration stops, and a callback that logs
                  the exact KL beside TRL's own (``pip install kltutorial[trl]``)
================  =========================================================================================
"""
