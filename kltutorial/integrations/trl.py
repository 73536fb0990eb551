r"""TRL's trainers on the toy task of book section 11, against the exact point each configuration stops at.

TRL 1.16 (the version pinned here) has two online RL trainers, ``GRPOTrainer`` and ``RLOOTrainer``; its
``PPOTrainer`` is gone. This module puts both on the enumerable task, where every quantity is exact:

* :func:`toy_model` builds a small ``transformers`` causal LM (Llama) and a fast word-level tokenizer over
  the task's tokens, offline; :func:`distill` fits it to the task's reference by enumeration;
* :func:`model_logprobs` is the model's exact distribution over the task's V**T sequences, restricted to
  the task's tokens and renormalised (:func:`model_tables` also reports the mass the model puts on other
  tokens);
* :func:`reward_function` is the proxy reward as TRL's ``reward_funcs`` take it;
* :func:`fixed_point` is where the trainer configured by a ``GRPOConfig`` or ``RLOOConfig`` stops, from
  :mod:`kltutorial.toyrlhf.recipes.fixed_points`;
* :class:`KLMonitorCallback` adds to the trainer's own log records the library's exact per-position KL
  summed along sampled completions, k1 and k3 with their standard errors, the k1 - k3 gap's z,
  :func:`~kltutorial.monitoring.exact_kl_check`'s z and the exact entropy, beside TRL's ``kl``, without
  changing any record the trainer writes; on any causal LM, gathered across processes.

**Where each configuration stops** (TRL 1.16's code, read in ``grpo_trainer.py`` and ``rloo_trainer.py``):

* ``GRPOTrainer`` adds :math:`\beta\,k_3` to the per-token loss, k3 evaluated at the current policy
  (``exp(ref - logp) - (ref - logp) - 1``). With ``use_bias_correction_kl=True`` (the default) it first
  multiplies k3 by the importance ratio :math:`\pi_\theta/\pi_{\theta_\mathrm{old}}`, not detached. On
  policy the ratio is 1 but its gradient is :math:`\nabla\log\pi_\theta`, so the term's expected gradient
  becomes that of :math:`\mathbb{E}_{\pi_\theta}[k_3]`, the per-token **reverse** KL; without it, k3's
  own gradient follows the per-token **forward** KL (book section 9). The advantage is
  :math:`s - \mu_G` divided by the group's std (``scale_rewards="group"``, the default), by the batch's
  (``"batch"``) or by nothing (``"none"``), with :math:`10^{-4}` added to the std. So the fixed point is
  the per-token one of that divergence with the score's scale of
  :func:`~kltutorial.toyrlhf.recipes.fixed_points.loss_fixed_point_table`. None of it is
  :math:`\pi^*_\beta`.
* ``RLOOTrainer`` subtracts :math:`\beta` times the sequence's k1 sum from the reward and uses the
  leave-one-out baseline: its expected gradient is :math:`\nabla(\mathbb{E}[s] - \beta\,\mathrm{KL})`, and
  it stops at :math:`\pi^*_\beta`. ``normalize_advantages`` subtracts the batch's mean advantage, which is 0
  (each group's leave-one-out advantages sum to zero), and divides by the batch's std: one positive number
  per batch, which one completion of B moves by O(1/B), so the point stays to that order.
* The loss's normalisation (``loss_type`` ``"grpo"``, ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"``, the default)
  scales score and penalty alike when every completion has the task's T tokens, as here, so it does not
  move the fixed point (the other loss types change the surrogate and are refused); ``num_iterations`` > 1
  and ``steps_per_generation`` above the accumulation steps reuse a batch against
  :math:`\pi_{\theta_\mathrm{old}}`, which changes the path, not the point where the expected on-policy
  gradient vanishes (derived, not run); ``epsilon`` clips nothing on policy.

**What the model is.** A ``LlamaForCausalLM`` whose vocabulary is the task's V tokens (ids 0 to V - 1, in
the order of :data:`~kltutorial.toyrlhf.VOCAB`, so a completion's ids are its sequence) and ``<s>``,
``</s>``, ``<pad>``. The prompt is ``<s>``; TRL samples ``max_completion_length`` = T tokens after it. The
network can put mass on the three special tokens (a completion that ends early, or holds ``<s>``): the
reward function gives such a completion :data:`OFF_TASK_REWARD`, and :func:`model_tables` reports that mass.
After :func:`distill` it is below 1e-3 at every prefix.

Shapes: V task tokens, T positions, V**T sequences, P prefixes, M the model's vocabulary (V + 3).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import exact as ex
from ..logprobs import exact_kl
from ..monitoring import entropy, exact_kl_check, kl_log_stats
from ..toyrlhf.recipes.fixed_points import loss_fixed_point_table
from ..toyrlhf.task import VOCAB, ToyTask, check_task

try:
    import transformers
    import trl
except ImportError as err:  # pragma: no cover - the requirements install both
    raise ImportError(
        "kltutorial.integrations.trl needs TRL and transformers: pip install 'kltutorial[trl]' "
        "(trl, transformers, accelerate, datasets)"
    ) from err

__all__ = [
    "SPECIAL_TOKENS",
    "OFF_TASK_REWARD",
    "toy_model",
    "distill",
    "ModelTables",
    "model_tables",
    "model_logprobs",
    "reward_function",
    "fixed_point",
    "fixed_point_candidates",
    "sampler_differences",
    "KLMonitorCallback",
    "MonitorSample",
    "monitor_statistics",
]

#: The special tokens after the task's V: the prompt, end of sequence, padding.
SPECIAL_TOKENS: tuple[str, str, str] = ("<s>", "</s>", "<pad>")
#: The reward of a completion that is not one of the task's sequences (shorter than T, or holding a special
#: token): below every sequence's proxy reward on the book's task, so the trainer pushes such mass down.
OFF_TASK_REWARD: float = -10.0


# --------------------------------------------------------------------------------------------------------
# The model and its exact distribution


def _tokenizer(vocab: Sequence[str]) -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {w: i for i, w in enumerate([*vocab, *SPECIAL_TOKENS])}
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bos, eos, pad = SPECIAL_TOKENS
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=pad
    )
    tok.padding_side = "left"
    return tok


def toy_model(
    task: ToyTask, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """A small Llama and its tokenizer for ``task``, built offline (no Hub, no download).

    Parameters
    ----------
    task : ToyTask
    hidden_size, num_layers, num_heads : int
        The network's width, depth and attention heads (``hidden_size`` a multiple of ``num_heads``).
    seed : int
        Seeds the initial weights (``torch.manual_seed`` inside a forked RNG: the global RNG is left as it
        was).

    Returns
    -------
    (model, tokenizer)
        A ``LlamaForCausalLM`` in float32 and a ``PreTrainedTokenizerFast``: token ``i < V`` is
        ``VOCAB[i]``, then :data:`SPECIAL_TOKENS`; the tokenizer splits on whitespace.
    """
    task = check_task(task)
    for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers), ("num_heads", num_heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads})")
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    V = task.space.vocab_size
    tok = _tokenizer(VOCAB[:V] if V <= len(VOCAB) else [f"t{i}" for i in range(V)])
    config = transformers.LlamaConfig(
        vocab_size=V + len(SPECIAL_TOKENS), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=task.space.length + 8, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def _plain_forward(model: torch.nn.Module):
    """The model's forward without accelerate's mixed-precision wrapper (``prepare`` keeps the original as
    ``_original_forward`` and wraps ``forward`` in autocast): the model's own precision."""
    return getattr(model, "_original_forward", model.forward)


def _prefix_inputs(task: ToyTask, bos: int) -> torch.Tensor:
    """(V**(T-1), T) inputs ``<s> y_1 ... y_{T-1}``: their logits at position L give every prefix of
    length L."""
    V, T = task.space.vocab_size, task.space.length
    rows = task.space.sequences[:: V, : T - 1]  # (V**(T-1), T-1): every prefix of length T-1, in order
    return torch.cat([torch.full((rows.shape[0], 1), bos, dtype=torch.long), rows], dim=1)


def _full_table(model: torch.nn.Module, task: ToyTask, bos: int,
                autocast: torch.dtype | None = None) -> torch.Tensor:
    """(P, M) log-softmax of the model's logits at every prefix of the task, float64, differentiable; the
    forward pass in the model's own precision, or under ``autocast`` to that dtype."""
    V, T, o = task.space.vocab_size, task.space.length, task.space.offsets
    device = next(model.parameters()).device
    inputs = _prefix_inputs(task, bos).to(device)
    dtype = autocast or torch.float32
    with torch.autocast(device_type=device.type, dtype=dtype, enabled=autocast is not None):
        logits = _plain_forward(model)(input_ids=inputs).logits  # (V**(T-1), T, M)
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1).cpu()
    parts = []
    for L in range(T):  # the prefixes of length L are the rows V**(T-1-L) apart, at position L
        parts.append(logp[:: V ** (T - 1 - L), L])  # (V**L, M)
    table = torch.cat(parts)
    assert table.shape[0] == o[-1]
    return table


@dataclass(frozen=True)
class ModelTables:
    """A causal LM's next-token distributions at every prefix of a task.

    Attributes
    ----------
    table : Tensor, shape (P, V)
        Log-probs of the task's tokens, renormalised over them.
    full : Tensor, shape (P, M)
        Log-probs over the model's whole vocabulary.
    off_task : Tensor, shape (P,)
        The mass the model puts on tokens outside the task's V at each prefix.
    """

    table: torch.Tensor
    full: torch.Tensor
    off_task: torch.Tensor

    @property
    def max_off_task(self) -> float:
        """The largest mass outside the task's tokens at any prefix."""
        return float(self.off_task.max())


def _check_model(model: object, tokenizer: object, task: ToyTask) -> int:
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(
            f"model must be a transformers causal LM (from toy_model), got {type(model).__name__}"
        )
    if not isinstance(tokenizer, transformers.PreTrainedTokenizerBase):
        raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    V = task.space.vocab_size
    if model.config.vocab_size < V:
        raise ValueError(
            f"model's vocabulary ({model.config.vocab_size}) is smaller than the task's {V} tokens"
        )
    if tokenizer.bos_token_id is None:
        raise ValueError("tokenizer has no bos_token: the prompt is <s>")
    return tokenizer.bos_token_id


@torch.no_grad()
def model_tables(model: torch.nn.Module, tokenizer: Any, task: ToyTask, *,
                 autocast: torch.dtype | None = None) -> ModelTables:
    """The model's exact next-token distributions at every prefix of ``task`` (one forward pass over the
    V**(T-1) longest prefixes, after the prompt ``<s>``), in float64 from the model's own precision.

    The forward pass runs outside autocast, also for a model that accelerate prepared for mixed precision
    (its wrapper is bypassed): a TRL trainer with ``bf16=True`` (the default, on the CPU too) trains under
    bf16 autocast, and its model's distribution read through the trainer is that one. ``autocast``
    (e.g. ``torch.bfloat16``) reads it under autocast instead, as the trainer computes it.
    """
    task = check_task(task)
    bos = _check_model(model, tokenizer, task)
    if autocast is not None and not isinstance(autocast, torch.dtype):
        raise TypeError(f"autocast must be a torch.dtype or None, got {type(autocast).__name__}")
    full = _full_table(model, task, bos, autocast)
    V = task.space.vocab_size
    on = torch.logsumexp(full[:, :V], dim=-1)  # (P,): log of the mass on the task's tokens
    return ModelTables(table=full[:, :V] - on[:, None], full=full, off_task=-torch.expm1(on))


def model_logprobs(model: torch.nn.Module, tokenizer: Any, task: ToyTask) -> torch.Tensor:
    """Log-probs (V**T,) float64 of the model's distribution over the task's sequences, restricted to the
    task's tokens and renormalised at every prefix; :func:`model_tables` reports the mass left out."""
    return ex.sequence_logprobs(task.space, model_tables(model, tokenizer, task).table)


def distill(
    model: torch.nn.Module, tokenizer: Any, task: ToyTask, *, steps: int = 300, lr: float = 3e-3,
    tol: float = 0.0,
) -> float:
    r"""Fit ``model`` to the task's reference by enumeration, in place: full-batch Adam on the exact
    :math:`\mathrm{KL}(\pi_\mathrm{ref}\|\pi_\theta) = \sum_h \pi_\mathrm{ref}(h) \sum_v
    \pi_\mathrm{ref}(v\mid h)\log\frac{\pi_\mathrm{ref}(v\mid h)}{\pi_\theta(v\mid h)}`, with
    :math:`\pi_\theta` over the model's whole vocabulary (so the fit also pushes the special tokens down).
    The learning rate decays linearly to 0 over the second half; it stops early once the KL is at most
    ``tol``. Returns the exact KL of the model as left (nats), the special tokens' mass counted.
    """
    task = check_task(task)
    bos = _check_model(model, tokenizer, task)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not (isinstance(lr, float | int) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    space, V = task.space, task.space.vocab_size
    ref = task.ref_table  # (P, V)
    o = space.offsets
    mass = torch.empty(o[-1], dtype=torch.float64)
    lp = task.ref_logprobs
    for L in range(space.length):  # pi_ref(h) for the prefixes of length L, from the sequence log-probs
        block = lp.reshape(V**L, -1) if L else lp.reshape(1, -1)
        mass[o[L] : o[L + 1]] = torch.logsumexp(block, dim=-1).exp()
    weight = mass[:, None] * ref.exp()  # (P, V): pi_ref(h v)
    entropy_term = float((weight * ref).sum())
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    half = steps // 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s < half else (steps - s) / (steps - half)
    )
    for _ in range(steps):
        loss = entropy_term - (weight * _full_table(model, task, bos)[:, :V]).sum()
        if loss.item() <= tol:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        return entropy_term - float((weight * _full_table(model, task, bos)[:, :V]).sum())


# --------------------------------------------------------------------------------------------------------
# The reward


def reward_function(task: ToyTask, reward: str = "proxy"):
    """The task's reward as TRL's ``reward_funcs`` take it: ``f(prompts, completions, completion_ids,
    **kwargs) -> list[float]``, read from the completion's token ids (a completion of T task tokens is the
    sequence with those ids); any other completion gets :data:`OFF_TASK_REWARD`.

    ``reward`` is ``"proxy"`` (what training sees) or ``"gold"``.
    """
    task = check_task(task)
    values = task.reward(reward).tolist()
    V, T = task.space.vocab_size, task.space.length
    powers = [V ** (T - 1 - t) for t in range(T)]

    def toy_reward(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            raise ValueError("the toy reward reads completion_ids (TRL passes them); got none")
        out = []
        for ids in completion_ids:
            ids = list(ids)
            if len(ids) != T or any(not 0 <= i < V for i in ids):
                out.append(OFF_TASK_REWARD)
            else:
                out.append(values[sum(i * p for i, p in zip(ids, powers, strict=True))])
        return out

    toy_reward.__name__ = f"toy_{reward}"
    return toy_reward


# --------------------------------------------------------------------------------------------------------
# Where a configuration stops

_SUPPORTED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")

#: The keys of ``generation_kwargs`` that leave the sampled distribution alone (caching, compilation, what
#: ``generate`` returns); any other key may change it (a logits processor, a stopping rule) and is refused.
NEUTRAL_GENERATION_KWARGS: frozenset[str] = frozenset({
    "use_cache", "cache_implementation", "cache_config", "disable_compile", "compile_config",
    "output_scores", "output_logits", "return_dict_in_generate", "output_attentions", "output_hidden_states",
})


@dataclass(frozen=True)
class _Field:
    """How :func:`fixed_point` treats one field of a trainer's config: ``role`` is ``"modelled"`` (read into
    the point), ``"path"`` (changes how the run gets there, not where the expected on-policy gradient
    vanishes), or ``"inert"`` (loading, logging, another engine's settings that are unused here); ``ok`` is
    the values it accepts (None: every value), ``want`` says them in the refusal."""

    role: str
    ok: Any = None  # Callable[[args], bool] | None
    want: str = ""


_neutral = {
    "temperature": _Field("modelled", lambda a: a.temperature == 1.0,
                          "1.0 (the exact policy is the untempered model)"),
    "top_p": _Field("modelled", lambda a: a.top_p == 1.0, "1.0 (no nucleus sampling)"),
    "top_k": _Field("modelled", lambda a: a.top_k in (0, None), "0 (no top-k sampling)"),
    "min_p": _Field("modelled", lambda a: a.min_p in (None, 0.0), "None (no min-p sampling)"),
    "repetition_penalty": _Field("modelled", lambda a: a.repetition_penalty == 1.0, "1.0 (no penalty)"),
    "generation_kwargs": _Field(
        "modelled",
        lambda a: not set(a.generation_kwargs or {}) - NEUTRAL_GENERATION_KWARGS,
        "no key that changes sampling (only " + ", ".join(sorted(NEUTRAL_GENERATION_KWARGS)) + ")"),
}

#: Every field TRL 1.16's ``GRPOConfig`` and ``RLOOConfig`` add to ``TrainingArguments``, as
#: :func:`fixed_point` treats it (the module docstring and :func:`fixed_point`'s say why).
CONFIG_FIELDS: dict[str, _Field] = {
    # the penalty, the group and the reward
    "beta": _Field("modelled", lambda a: a.beta > 0,
                   "beta > 0 (without a KL penalty the trainer climbs the reward until the policy is "
                   "deterministic: no fixed point)"),
    "num_generations": _Field(
        "modelled", lambda a: isinstance(a.num_generations, int) and a.num_generations >= 2,
        "at least 2 (a group baseline)"),
    "max_completion_length": _Field("modelled"),  # checked against the task's T in fixed_point
    "reward_weights": _Field("modelled", lambda a: a.reward_weights is None or len(a.reward_weights) == 1,
                             "one weight (one reward function)"),
    "scale_rewards": _Field("modelled", lambda a: a.scale_rewards in ("none", "group", "batch"),
                            "'none', 'group' or 'batch'"),
    "use_bias_correction_kl": _Field("modelled"),
    "loss_type": _Field("modelled", lambda a: a.loss_type in _SUPPORTED_LOSSES,
                        f"one of {', '.join(_SUPPORTED_LOSSES)} (a normalisation of the token sum)"),
    "importance_sampling_level": _Field("modelled", lambda a: a.importance_sampling_level == "token",
                                        "'token' (a sequence-level ratio changes k3's weighting)"),
    "multi_objective_aggregation": _Field(
        "modelled", lambda a: a.multi_objective_aggregation == "sum_then_normalize", "'sum_then_normalize'"),
    "normalize_advantages": _Field("modelled"),  # RLOO: subtracts 0, divides by one positive number per batch
    **_neutral,
    # settings that change the objective: refused unless off
    "mask_truncated_completions": _Field(
        "modelled", lambda a: not a.mask_truncated_completions,
        "False (every completion of the task is cut at max_completion_length)"),
    "sync_ref_model": _Field("modelled", lambda a: not a.sync_ref_model,
                             "False (a moving reference has no fixed point)"),
    "top_entropy_quantile": _Field("modelled", lambda a: a.top_entropy_quantile == 1.0,
                                   "1.0 (every token in the loss)"),
    "entropy_coef": _Field("modelled", lambda a: a.entropy_coef == 0.0, "0.0 (no entropy bonus)"),
    "use_adaptive_entropy": _Field("modelled", lambda a: not a.use_adaptive_entropy,
                                   "False (it turns TRL's entropy bonus on)"),
    "off_policy_mask_threshold": _Field("modelled", lambda a: a.off_policy_mask_threshold is None,
                                        "None (no sequence masking)"),
    "reward_clip_range": _Field("modelled", lambda a: a.reward_clip_range is None,
                                "None (no reward clipping)"),
    "use_vllm": _Field("modelled", lambda a: not a.use_vllm,
                       "False (vLLM samples in its own precision and kernels)"),
    "use_transformers_continuous_batching": _Field(
        "modelled", lambda a: not a.use_transformers_continuous_batching,
        "False (another sampler, not checked here)"),
    "use_transformers_paged": _Field("modelled", lambda a: not a.use_transformers_paged,
                                     "False (another sampler, not checked here)"),
    # the path, not the point
    "num_iterations": _Field("path"), "epsilon": _Field("path"), "epsilon_high": _Field("path"),
    "delta": _Field("path"), "steps_per_generation": _Field("path"), "generation_batch_size": _Field("path"),
    "disable_dropout": _Field("path"), "cast_lm_head_to_fp32": _Field("path"),
    "shuffle_dataset": _Field("path"),
    # unused with the settings above (another loss type, the entropy controller off, no sync, no vLLM)
    **{name: _Field("inert") for name in (
        "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
        "vespo_lambda_neg", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
        "ref_model_mixup_alpha", "ref_model_sync_steps", "vllm_mode", "vllm_model_impl",
        "vllm_enable_sleep_mode", "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_server_host",
        "vllm_server_port", "vllm_server_timeout", "vllm_group_port", "vllm_gpu_memory_utilization",
        "vllm_max_model_length", "vllm_tensor_parallel_size", "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap",
        "transformers_continuous_batching_config")},
    # loading, the data pipeline, evaluation, logging
    **{name: _Field("inert") for name in (
        "model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "num_generations_eval",
        "ds3_gather_for_generation", "pad_to_multiple_of", "chat_template_kwargs", "cache_implementation",
        "max_tool_calling_iterations", "log_completions", "log_multimodal", "num_completions_to_print",
        "log_unique_prompts", "log_completions_hub_repo")},
}

#: ``TrainingArguments`` fields that move the point (the rest change the path: optimiser, schedule,
#: clipping of the step, precision, batching).
TRAINING_ARGUMENT_FIELDS: dict[str, _Field] = {
    "weight_decay": _Field("modelled", lambda a: a.weight_decay == 0.0,
                           "0.0 (weight decay pulls the weights, and so the point, toward zero)"),
}


def _own_fields(args: Any) -> list[str]:
    base = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    return [f.name for f in dataclasses.fields(args) if f.name not in base]


def _check_fields(args: Any, task: ToyTask) -> tuple[float, int, float]:
    """Refuse, naming it, every setting of ``args`` that moves the point and that the package does not
    model; return (beta, G, the reward's weight)."""
    cls = type(args).__name__
    for name in _own_fields(args):
        rule = CONFIG_FIELDS.get(name)
        if rule is None:  # a field TRL 1.16 did not have: accepted only at its default
            default = next(f for f in dataclasses.fields(args) if f.name == name).default
            if getattr(args, name) != default:
                raise ValueError(
                    f"{cls}.{name}={getattr(args, name)!r}: fixed_point does not know this setting (TRL 1.16 "
                    "has no such field) and cannot tell whether it moves the point; leave it at its default"
                )
            continue
        if rule.ok is not None and not rule.ok(args):
            raise ValueError(f"{cls}.{name}={getattr(args, name)!r}: fixed_point needs {rule.want}")
    for name, rule in TRAINING_ARGUMENT_FIELDS.items():
        if not rule.ok(args):
            raise ValueError(f"{cls}.{name}={getattr(args, name)!r}: fixed_point needs {rule.want}")
    if args.max_completion_length != task.space.length:
        raise ValueError(f"{cls}.max_completion_length={args.max_completion_length!r}: fixed_point needs "
                         f"the task's length, {task.space.length}")
    weights = args.reward_weights
    return float(args.beta), args.num_generations, 1.0 if weights is None else float(weights[0])


def _grpo_settings(args: Any) -> tuple[str, str]:
    """(divergence, scale) of a GRPOConfig whose fields :func:`_check_fields` accepted."""
    return ("reverse" if args.use_bias_correction_kl else "forward"), args.scale_rewards


def fixed_point(task: ToyTask, args: Any) -> torch.Tensor:
    r"""Log-probs (V**T,) of the policy at which the trainer configured by ``args`` stops, relative to the
    reference that ``task`` carries (for a distilled network: ``with_reference(task, table)`` of its table).

    Parameters
    ----------
    task : ToyTask
    args : trl.GRPOConfig or trl.RLOOConfig

    Returns
    -------
    Tensor, shape (V**T,), float64

    Raises
    ------
    ValueError
        For every setting that moves the point and that the package does not model; the message names the
        setting and the value it needs. Also for a field TRL 1.16 does not have, unless it is at its default.
    TypeError
        For ``args`` of another type.
    RuntimeError
        Only if the self-consistent GRPO point with ``scale_rewards="group"`` or ``"batch"`` did not settle
        (:func:`~kltutorial.toyrlhf.recipes.fixed_points.loss_fixed_point_table`).

    Notes
    -----
    Every field that TRL 1.16's ``GRPOConfig`` and ``RLOOConfig`` add to ``TrainingArguments``, read one by
    one (``CONFIG_FIELDS`` holds the same list, and a test checks it against the installed TRL):

    * **modelled**: ``beta`` (> 0), ``num_generations`` (G >= 2), ``max_completion_length`` (the task's
      T), ``reward_weights`` (one), ``scale_rewards``, ``use_bias_correction_kl``, ``loss_type`` (grpo,
      bnpo, dr_grpo, dapo: with every completion T tokens long they scale score and penalty alike),
      ``importance_sampling_level`` ("token"), ``multi_objective_aggregation`` ("sum_then_normalize"),
      ``normalize_advantages`` (RLOO: the batch mean it subtracts is 0, the std it divides by one positive
      number per batch);
    * **refused unless neutral**, since each changes the sampled distribution or the objective:
      ``temperature`` (1), ``top_p`` (1), ``top_k`` (0), ``min_p`` (None), ``repetition_penalty`` (1),
      ``generation_kwargs`` (only keys of ``NEUTRAL_GENERATION_KWARGS``), ``mask_truncated_completions``,
      ``sync_ref_model``, ``top_entropy_quantile`` (1), ``entropy_coef`` (0), ``use_adaptive_entropy``
      (it turns the entropy bonus on), ``off_policy_mask_threshold``, ``reward_clip_range``, ``use_vllm``,
      ``use_transformers_continuous_batching`` and ``use_transformers_paged`` (other samplers); and of
      ``TrainingArguments``, ``weight_decay`` (0);
    * **the path, not the point** (where the expected on-policy gradient vanishes does not depend on
      them): ``num_iterations``, ``steps_per_generation``, ``generation_batch_size`` (both reuse a batch
      against :math:`\pi_{\theta_\mathrm{old}}`), ``epsilon``, ``epsilon_high``, ``delta`` (clipping, inactive
      on policy), ``disable_dropout``, ``cast_lm_head_to_fp32``, ``shuffle_dataset``, and the optimiser,
      schedule, step clipping and precision of ``TrainingArguments``;
    * **inert** with the settings above: ``sapo_temperature_neg``, ``sapo_temperature_pos``,
      ``vespo_k_pos``, ``vespo_lambda_pos``, ``vespo_k_neg``, ``vespo_lambda_neg`` (other loss types),
      ``entropy_coef_min``, ``entropy_coef_max``, ``entropy_coef_delta``, ``entropy_target`` (the adaptive
      entropy controller), ``ref_model_mixup_alpha``, ``ref_model_sync_steps`` (the reference's sync),
      every ``vllm_*`` field and ``transformers_continuous_batching_config`` (other engines),
      ``model_init_kwargs``, ``trust_remote_code``, ``router_aux_loss_coef`` (a mixture of experts' router;
      the toy model has none), ``num_generations_eval``, ``ds3_gather_for_generation``,
      ``pad_to_multiple_of``, ``chat_template_kwargs``, ``cache_implementation``,
      ``max_tool_calling_iterations``, ``log_completions``, ``log_multimodal``, ``log_unique_prompts``,
      ``log_completions_hub_repo`` and ``num_completions_to_print``.
    """
    task = check_task(task)
    scores = task.proxy_reward
    if isinstance(args, trl.GRPOConfig):
        beta, G, w = _check_fields(args, task)
        divergence, scale = _grpo_settings(args)
        table = loss_fixed_point_table(
            task.space, task.ref_table, w * scores, beta, divergence=divergence, group_size=G, scale=scale
        )
        return ex.sequence_logprobs(task.space, table)
    if isinstance(args, trl.RLOOConfig):
        beta, _, w = _check_fields(args, task)
        return ex.optimal_policy(task.ref_logprobs, w * scores, beta)
    raise TypeError(f"args must be a trl.GRPOConfig or trl.RLOOConfig, got {type(args).__name__}")


def fixed_point_candidates(
    task: ToyTask, args: Any, *, scales: Sequence[str] = ("none", "group")
) -> dict[str, torch.Tensor]:
    r"""Where the trainer could be expected to stop, by name, each (V**T,) log-probs: :math:`\pi^*_\beta`
    (``"optimum"``), and the per-token forward and reverse fixed points with each advantage scale of
    ``scales`` (``"forward/group"``, ``"reverse/none"``, ...; for an ``RLOOConfig`` only ``"none"`` with
    :math:`c = \beta`, since RLOO's leave-one-out baseline leaves the score's weight at 1). ``args``'s own
    (:func:`fixed_point`) is among them when its ``scale_rewards`` is in ``scales``."""
    task = check_task(task)
    beta, G, w = _check_fields(args, task)
    scores = w * task.proxy_reward
    out = {"optimum": ex.optimal_policy(task.ref_logprobs, scores, beta)}
    grpo = isinstance(args, trl.GRPOConfig)
    for divergence in ("forward", "reverse"):
        for scale in scales if grpo else ("none",):
            table = loss_fixed_point_table(task.space, task.ref_table, scores, beta, divergence=divergence,
                                           group_size=G if grpo else None, scale=scale)
            out[f"{divergence}/{scale}"] = ex.sequence_logprobs(task.space, table)
    return out


# --------------------------------------------------------------------------------------------------------
# Monitoring a run


@dataclass(frozen=True)
class MonitorSample:
    """The completions :class:`KLMonitorCallback` sampled on one rank and their per-token tensors, each of
    shape (B, T): ``tokens`` (the ids, padded after an EOS), ``policy`` and ``reference`` (the sampled
    tokens' log-probs), ``kl`` and ``entropy`` (exact, of the next-token distributions at each position)
    and ``mask`` (the completion's tokens, its EOS included)."""

    tokens: torch.Tensor  # (B, T) the completions' token ids, padded after an EOS
    policy: torch.Tensor  # (B, T) log-probs of the sampled tokens
    reference: torch.Tensor  # (B, T)
    kl: torch.Tensor  # (B, T) exact KL of the next-token distributions
    entropy: torch.Tensor  # (B, T) exact entropy of the policy's next-token distribution
    mask: torch.Tensor  # (B, T) bool


def monitor_statistics(policy: torch.Tensor, reference: torch.Tensor, kl: torch.Tensor,
                       entropy_: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The callback's numbers from per-token tensors (B, T) of sampled completions: ``exact_kl``, the mean
    over the completions of the exact per-position KLs summed along each (an unbiased estimate of the
    sequence KL, with ``exact_kl_se`` its standard error: the positions' terms are exact, the prefixes
    sampled) and per token, k1 and k3 per sequence with their standard errors, the gap's z, the exact-KL
    check's z and the exact entropy per token.

    ``policy`` and ``reference`` are the sampled tokens' log-probs, ``kl`` and ``entropy_`` the exact KL
    and entropy of the next-token distributions at each position, ``mask`` the completion's tokens. A z
    is NaN when its standard error vanishes (below 1e-12 of the mean's size: a policy so concentrated
    that every completion of the batch is the same).
    """
    m = mask.bool()
    stats = kl_log_stats(policy, reference, m)
    d, d_se = exact_kl_check(policy, reference, kl, m)
    zero = torch.zeros_like(kl, dtype=torch.float64)
    per_seq = torch.where(m, kl.to(torch.float64), zero).sum(-1)
    tokens = int(m.sum())
    B = per_seq.shape[0]

    def z(mean: float, se: float) -> float:  # NaN when the batch has no spread (every sample the same)
        return mean / se if se > 1e-12 * max(1.0, abs(mean)) else math.nan

    return {
        "exact_kl": float(per_seq.mean()),
        "exact_kl_se": float(per_seq.std() / math.sqrt(B)) if B > 1 else math.nan,
        "exact_kl_per_token": float(per_seq.sum()) / tokens,
        "k1": stats.k1,
        "k1_se": stats.k1_se,
        "k3": stats.k3,
        "k3_se": stats.k3_se,
        "k3_per_token": stats.k3 * B / tokens,
        "gap_z": z(stats.gap, stats.gap_se),
        "check_z": z(d, d_se),
        "entropy_per_token": float(torch.where(m, entropy_.to(torch.float64), zero).sum()) / tokens,
    }


#: The ``GenerationConfig`` fields that add a logits processor or a stopping rule to sampling, with the
#: values at which they do nothing.
SAMPLER_FIELDS: dict[str, tuple[Any, ...]] = {
    "top_k": (None, 0), "top_p": (None, 1.0), "min_p": (None, 0.0), "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0), "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,), "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,), "sequence_bias": (None,), "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,), "min_length": (None, 0), "min_new_tokens": (None, 0),
    "exponential_decay_length_penalty": (None,), "diversity_penalty": (None, 0.0),
}


def sampler_differences(trainer: Any) -> list[str]:
    """The settings with which ``trainer`` samples from something other than its policy's softmax at its
    temperature: each as ``"name=value"``.

    A TRL trainer samples with its ``generation_config`` (built from its args: ``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty`` and ``generation_kwargs``); transformers fills each field left None
    there from the model's own ``generation_config`` (the checkpoint's), so both are read. A trainer without
    a ``generation_config`` samples as its model's ``generation_config`` says.
    """
    model = getattr(trainer, "model", None)
    model_config = getattr(model, "generation_config", None)
    own = getattr(trainer, "generation_config", None)
    out = []
    for name, neutral in SAMPLER_FIELDS.items():
        value = getattr(own, name, None)
        if value is None:
            value = getattr(model_config, name, None)
        if value not in neutral:
            out.append(f"{name}={value!r}")
    return out


class KLMonitorCallback(transformers.TrainerCallback):
    r"""Every ``every`` steps, sample completions of fixed prompts from the policy and add the library's exact
    KL to the trainer's own log record, beside TRL's ``kl``.

    **What it measures.** It samples ``samples_per_prompt`` completions of each prompt (``max_new_tokens``
    at most, stopping at the tokenizer's EOS) from the policy's softmax at the trainer's ``temperature``
    (``args.temperature``, 1 for a trainer without one), with its own sampler: a loop over the model's
    forward pass with its KV cache and a ``torch.Generator`` seeded from ``seed``, the step and the rank. It
    never calls ``generate``, so no field of the checkpoint's ``generation_config`` (a
    ``repetition_penalty``, ``min_p``, ``no_repeat_ngram_size`` ...) reaches its samples. It scores them
    under the policy and the reference at that temperature, as TRL computes its ``kl`` (both models'
    logits divided by it), in float64 from the models' own precision, outside autocast (accelerate's
    mixed-precision wrapper is bypassed); then per token the sampled tokens' log-probs, the exact KL of
    the two next-token distributions (:func:`~kltutorial.logprobs.exact_kl`) and the policy's exact
    entropy, and :func:`monitor_statistics` of them. When the trainer's own sampler differs from that
    softmax (:func:`sampler_differences`: top-k, top-p, a penalty, from its args or the checkpoint), the
    constructor warns and every record says so (``kltutorial/sampler_differs`` = 1): TRL's rollouts then
    come from another distribution than the one both measure.

    **What it changes: nothing.** It does not call ``trainer.log`` (a call there would make transformers
    skip the trainer's own record of that step and clear TRL's metric buffer). Its numbers wait until the
    trainer writes its next record, and join it: the callback wraps the trainer's ``log`` (this instance's
    attribute) so that the record gets the keys ``kltutorial/...`` and ``kltutorial/step`` (the step they
    were measured at) before the trainer's own ``log`` runs; every ``report_to`` sink and
    ``state.log_history`` see one record. With ``every`` a multiple of ``logging_steps`` the numbers are
    the record's own step's; otherwise the latest monitored step's (every monitored step is in
    ``history``). Sampling consumes no global random number and leaves the model's training mode as it was.

    Under several processes (``accelerate launch``) each rank samples its share of the prompts (prompt
    ``i`` on rank ``i mod R``), the per-token tensors are gathered, and every rank computes the same numbers
    from all of them (a rank may hold more prompts than another, or none). Not under DeepSpeed ZeRO-3 or
    FSDP, whose sharded parameters need every rank in every forward pass, while here each rank samples for
    its own prompts only.

    TRL's GRPO ``kl`` is the mean per-token k3 of its training batch (weighted by the importance ratio, 1
    on policy, when ``use_bias_correction_kl``), RLOO's the mean per-token k1: compare them with
    ``k3_per_token`` and ``exact_kl_per_token``.

    Parameters
    ----------
    trainer : transformers.Trainer
        The trainer to monitor (TRL's ``GRPOTrainer`` or ``RLOOTrainer``, or any): its model is the
        policy, and its ``ref_model`` the reference unless ``ref_model`` is given.
    prompts : sequence of str
        The prompts, as text the trainer's tokenizer reads (no special tokens added).
    samples_per_prompt : int
    max_new_tokens : int
    every : int
        Monitor at every ``every``-th global step (and at step 0, before training, when the training
        begins).
    ref_model : torch.nn.Module, optional
    seed : int
    """

    def __init__(self, trainer: Any, prompts: Sequence[str], *, samples_per_prompt: int = 64,
                 max_new_tokens: int = 16, every: int = 10, ref_model: torch.nn.Module | None = None,
                 seed: int = 0) -> None:
        if not hasattr(trainer, "model") or not hasattr(trainer, "log"):
            raise TypeError(f"trainer must be a transformers Trainer, got {type(trainer).__name__}")
        if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts must be a non-empty sequence of str")
        for name, value in (("samples_per_prompt", samples_per_prompt), ("max_new_tokens", max_new_tokens),
                            ("every", every)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        state = getattr(getattr(trainer, "accelerator", None), "state", None)
        zero = getattr(getattr(state, "deepspeed_plugin", None), "zero_stage", None)
        if getattr(state, "fsdp_plugin", None) is not None or zero == 3:
            raise ValueError(
                "KLMonitorCallback generates each rank's prompts on that rank alone, which FSDP and "
                "DeepSpeed ZeRO-3 cannot run (their sharded parameters need every rank in every forward pass)"
            )
        ref = ref_model if ref_model is not None else getattr(trainer, "ref_model", None)
        if ref is None:
            raise ValueError("no reference model: the trainer has none (beta = 0, or PEFT); pass ref_model")
        temperature = float(getattr(getattr(trainer, "args", None), "temperature", 1.0))
        if not temperature > 0:
            raise ValueError(f"the trainer's temperature must be positive, got {temperature!r}")
        self.trainer, self.ref_model = trainer, ref
        self.prompts, self.samples_per_prompt = list(prompts), samples_per_prompt
        self.max_new_tokens, self.every, self.seed = max_new_tokens, every, seed
        self.temperature = temperature
        #: The settings with which the trainer's sampler differs from the softmax measured here.
        self.sampler_differences = sampler_differences(trainer)
        if self.sampler_differences:
            warnings.warn(
                "KLMonitorCallback samples the policy's softmax at temperature "
                f"{temperature:g}; the trainer samples with {', '.join(self.sampler_differences)}, so its "
                "rollouts (and its own kl) come from another distribution (logged as "
                "kltutorial/sampler_differs)",
                stacklevel=2)
        self.history: list[dict[str, float]] = []
        self._pending: dict[str, float] | None = None
        self._trainer_log = trainer.log
        trainer.log = self._log  # the record the trainer writes next gets the callback's numbers

    # -- the callback's events
    def on_train_begin(self, args, state, control, **kwargs):
        self._monitor(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self._monitor(state.global_step)

    # -- joining the trainer's record
    def _log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self._pending is not None and not any(str(k).startswith("eval_") for k in logs):
            logs.update(self._pending)
            self._pending = None
        return self._trainer_log(logs, *args, **kwargs)

    # -- the work
    def _processing(self):
        tok = getattr(self.trainer, "processing_class", None)
        tok = getattr(tok, "tokenizer", tok)  # a processor holds its tokenizer
        if tok is None:
            raise ValueError("the trainer has no processing_class (tokenizer) to read the prompts with")
        return tok

    def sample(self, step: int) -> MonitorSample:
        """This rank's completions at ``step`` and their per-token tensors (B_rank, max_new_tokens)."""
        acc = getattr(self.trainer, "accelerator", None)
        rank, world = (acc.process_index, acc.num_processes) if acc is not None else (0, 1)
        model = acc.unwrap_model(self.trainer.model) if acc is not None else self.trainer.model
        ref = acc.unwrap_model(self.ref_model) if acc is not None else self.ref_model
        tok = self._processing()
        mine = [p for i, p in enumerate(self.prompts) if i % world == rank]
        was_training = model.training
        try:
            return _sample_completions(model, ref, tok, mine, self.samples_per_prompt, self.max_new_tokens,
                                       seed=hash((self.seed, step, rank)) % (2**63),
                                       temperature=self.temperature)
        finally:
            model.train(was_training)

    def statistics(self, sample: MonitorSample) -> dict[str, float]:
        """:func:`monitor_statistics` of ``sample`` gathered from every rank."""
        acc = getattr(self.trainer, "accelerator", None)
        columns = (sample.policy, sample.reference, sample.kl, sample.entropy, sample.mask.to(torch.float64))
        stacked = torch.stack(columns, dim=-1)  # (B_rank, T, 5)
        if acc is not None and acc.num_processes > 1:
            # The ranks may hold different numbers of completions (prompt i on rank i mod R, so some may
            # hold none): pad each rank's rows to the largest count with rows marked empty, gather once in
            # rank order, and drop the padding.
            filled = torch.ones(*stacked.shape[:2], 1, dtype=torch.float64)
            stacked = torch.cat([stacked, filled], dim=-1).to(acc.device).contiguous()
            stacked = acc.gather(acc.pad_across_processes(stacked, dim=0)).cpu()
            stacked = stacked[stacked[:, 0, -1] == 1, :, :-1]
        p, r, k, h, m = stacked.unbind(-1)
        return monitor_statistics(p, r, k, h, m.bool())

    def _monitor(self, step: int) -> None:
        stats = self.statistics(self.sample(step))
        self.history.append({"step": step, **stats})
        self._pending = {**{f"kltutorial/{k}": v for k, v in stats.items()}, "kltutorial/step": step,
                         "kltutorial/temperature": self.temperature,
                         "kltutorial/sampler_differs": float(bool(self.sampler_differences))}


@torch.no_grad()
def _sample_completions(model: torch.nn.Module, ref: torch.nn.Module, tok: Any, prompts: Sequence[str],
                        n: int, max_new_tokens: int, *, seed: int, temperature: float = 1.0) -> MonitorSample:
    """``n`` completions of each prompt from the policy's softmax at ``temperature``, and their per-token
    tensors; the models in eval mode (the caller restores the policy's), autocast off."""
    device = next(model.parameters()).device
    model.eval()
    T = max_new_tokens
    forward, ref_forward = _plain_forward(model), _plain_forward(ref)
    gen = torch.Generator(device=device).manual_seed(seed)
    parts = []
    with torch.autocast(device_type=device.type, enabled=False):
        for prompt in prompts:
            ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids.to(device)  # (1, L)
            prompt_ids = ids.expand(n, -1)
            completion = _sample_tokens(forward, prompt_ids, T, temperature, tok.eos_token_id,
                                        tok.pad_token_id, gen)  # (n, T)
            # a completion's tokens: up to and including its first EOS (as TRL's completion mask)
            is_eos = completion == tok.eos_token_id
            after = (is_eos.cumsum(-1) - is_eos.long()) > 0
            mask = ~after
            full = torch.cat([prompt_ids, completion], dim=1)
            attn = torch.cat([torch.ones_like(prompt_ids), mask.long()], dim=1)
            L = ids.shape[1]
            lp, lq = (_completion_logprobs(f, full, attn, L, temperature) for f in (forward, ref_forward))
            token = completion.unsqueeze(-1)
            parts.append(MonitorSample(
                tokens=completion.cpu(),
                policy=lp.gather(-1, token).squeeze(-1).cpu(),
                reference=lq.gather(-1, token).squeeze(-1).cpu(),
                kl=exact_kl(lp, lq, mask).cpu(),
                entropy=entropy(lp).cpu(),
                mask=mask.cpu(),
            ))
    if not parts:  # a rank that holds none of the prompts (more processes than prompts)
        empty = torch.empty(0, T, dtype=torch.float64)
        return MonitorSample(torch.empty(0, T, dtype=torch.long), empty, empty, empty, empty,
                             torch.empty(0, T, dtype=torch.bool))
    fields = ("tokens", "policy", "reference", "kl", "entropy", "mask")
    return MonitorSample(*(torch.cat([getattr(s, f) for s in parts]) for f in fields))


def _completion_logprobs(forward, full: torch.Tensor, attn: torch.Tensor, L: int,
                         temperature: float) -> torch.Tensor:
    """(n, T, M) log-probs at every completion position of ``full`` (prompt of ``L`` tokens, then the
    completion), at ``temperature``, in float64."""
    logits = forward(input_ids=full, attention_mask=attn).logits[:, L - 1 : -1]
    return torch.log_softmax(logits.to(torch.float64) / temperature, -1)


def _sample_tokens(forward, prompt_ids: torch.Tensor, T: int, temperature: float, eos: int | None,
                   pad: int, gen: torch.Generator) -> torch.Tensor:
    """(n, T) tokens drawn from ``softmax(logits / temperature)`` one position at a time, with the KV cache;
    after a row's EOS its positions hold ``pad`` (and are masked by the caller)."""
    n = prompt_ids.shape[0]
    # transformers 5.24 names the KV cache ``cache`` (argument and output); earlier, ``past_key_values``
    key = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    out = forward(input_ids=prompt_ids, use_cache=True)
    tokens = torch.full((n, T), pad, dtype=torch.long, device=prompt_ids.device)
    done = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)
    for t in range(T):
        probs = torch.softmax(out.logits[:, -1].to(torch.float64) / temperature, -1)  # (n, M)
        y = torch.multinomial(probs, 1, generator=gen).squeeze(-1)  # (n,)
        y = torch.where(done, torch.full_like(y, pad), y)
        tokens[:, t] = y
        if eos is not None:
            done |= y == eos
        if t + 1 == T or bool(done.all()):
            break
        out = forward(input_ids=y[:, None], use_cache=True, **{key: getattr(out, key)})
    return tokens
