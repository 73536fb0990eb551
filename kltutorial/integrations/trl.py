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
* :class:`KLMonitorCallback` logs the library's exact per-token KL, k1 and k3 with their standard errors,
  the k1 - k3 gap's z, :func:`~kltutorial.monitoring.exact_kl_check`'s z and the exact entropy, through
  the trainer's own logging, beside TRL's ``kl``; on any causal LM, gathered across processes.

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
  it stops at :math:`\pi^*_\beta`. ``normalize_advantages`` divides every advantage by one positive number
  (and subtracts the batch mean, a baseline): the direction, and so the fixed point, stay.
* The loss's normalisation (``loss_type`` ``"grpo"``, ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"``, the default)
  scales score and penalty alike when every completion has the task's T tokens, as here, so it does not
  move the fixed point; ``num_iterations`` > 1 reuses a batch, which changes the path, not the point where
  the expected on-policy gradient vanishes; ``epsilon`` clips nothing on policy.

**What the model is.** A ``LlamaForCausalLM`` whose vocabulary is the task's V tokens (ids 0 to V - 1, in
the order of :data:`~kltutorial.toyrlhf.VOCAB`, so a completion's ids are its sequence) and ``<s>``,
``</s>``, ``<pad>``. The prompt is ``<s>``; TRL samples ``max_completion_length`` = T tokens after it. The
network can put mass on the three special tokens (a completion that ends early, or holds ``<s>``): the
reward function gives such a completion :data:`OFF_TASK_REWARD`, and :func:`model_tables` reports that mass.
After :func:`distill` it is below 1e-3 at every prefix.

Shapes: V task tokens, T positions, V**T sequences, P prefixes, M the model's vocabulary (V + 3).
"""

from __future__ import annotations

import math
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


def _prefix_inputs(task: ToyTask, bos: int) -> torch.Tensor:
    """(V**(T-1), T) inputs ``<s> y_1 ... y_{T-1}``: their logits at position L give every prefix of
    length L."""
    V, T = task.space.vocab_size, task.space.length
    rows = task.space.sequences[:: V, : T - 1]  # (V**(T-1), T-1): every prefix of length T-1, in order
    return torch.cat([torch.full((rows.shape[0], 1), bos, dtype=torch.long), rows], dim=1)


def _full_table(model: torch.nn.Module, task: ToyTask, bos: int) -> torch.Tensor:
    """(P, M) log-softmax of the model's logits at every prefix of the task, float64, differentiable."""
    V, T, o = task.space.vocab_size, task.space.length, task.space.offsets
    inputs = _prefix_inputs(task, bos).to(next(model.parameters()).device)
    logits = model(input_ids=inputs).logits  # (V**(T-1), T, M)
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
def model_tables(model: torch.nn.Module, tokenizer: Any, task: ToyTask) -> ModelTables:
    """The model's exact next-token distributions at every prefix of ``task`` (one forward pass over the
    V**(T-1) longest prefixes, after the prompt ``<s>``), in float64."""
    task = check_task(task)
    bos = _check_model(model, tokenizer, task)
    full = _full_table(model, task, bos)
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


def _require(args: Any, name: str, ok: bool, want: str) -> None:
    if not ok:
        raise ValueError(
            f"{type(args).__name__}.{name}={getattr(args, name, None)!r}: fixed_point needs {want}"
        )


def _check_common(args: Any, task: ToyTask) -> tuple[float, int, float]:
    beta = float(args.beta)
    if beta <= 0:
        raise ValueError(
            f"{type(args).__name__}.beta={args.beta!r}: without a KL penalty the trainer has no fixed point "
            "(it climbs the reward until the policy is deterministic); set beta > 0"
        )
    G = args.num_generations
    _require(args, "num_generations", isinstance(G, int) and G >= 2, "at least 2 (a group baseline)")
    _require(args, "temperature", args.temperature == 1.0, "1.0 (the exact policy is the untempered model)")
    _require(args, "top_p", args.top_p == 1.0, "1.0 (no nucleus sampling)")
    _require(args, "top_k", args.top_k in (0, None), "0 (no top-k sampling)")
    _require(args, "min_p", getattr(args, "min_p", None) is None, "None")
    _require(args, "repetition_penalty", getattr(args, "repetition_penalty", 1.0) == 1.0, "1.0")
    _require(args, "max_completion_length", args.max_completion_length == task.space.length,
             f"the task's length, {task.space.length}")
    _require(args, "mask_truncated_completions", not args.mask_truncated_completions,
             "False (every completion of the task is cut at max_completion_length)")
    _require(args, "sync_ref_model", not args.sync_ref_model, "False (a moving reference has no fixed point)")
    _require(args, "use_vllm", not getattr(args, "use_vllm", False), "False")
    weights = getattr(args, "reward_weights", None)
    _require(args, "reward_weights", weights is None or len(weights) == 1, "one weight (one reward function)")
    return beta, G, 1.0 if weights is None else float(weights[0])


def _grpo_settings(args: Any) -> tuple[str, str]:
    """(divergence, scale) of a GRPOConfig, or ValueError naming the setting the package cannot compute."""
    _require(args, "loss_type", args.loss_type in _SUPPORTED_LOSSES, f"one of {', '.join(_SUPPORTED_LOSSES)}")
    _require(args, "importance_sampling_level", args.importance_sampling_level == "token", "'token'")
    _require(args, "scale_rewards", args.scale_rewards in ("none", "group", "batch"),
             "'none', 'group' or 'batch'")
    _require(args, "multi_objective_aggregation", args.multi_objective_aggregation == "sum_then_normalize",
             "'sum_then_normalize'")
    _require(args, "top_entropy_quantile", args.top_entropy_quantile == 1.0, "1.0 (every token in the loss)")
    _require(args, "off_policy_mask_threshold", args.off_policy_mask_threshold is None, "None")
    _require(args, "entropy_coef", not getattr(args, "entropy_coef", 0.0), "0 (no entropy bonus)")
    divergence = "reverse" if args.use_bias_correction_kl else "forward"
    return divergence, args.scale_rewards


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
        For ``beta`` = 0 (no fixed point), a sampling setting that makes the sampled policy differ from the
        model's distribution (temperature, top-k, top-p, ...), and a setting whose fixed point the package
        cannot compute; the message names the setting.
    TypeError
        For ``args`` of another type.
    """
    task = check_task(task)
    scores = task.proxy_reward
    if isinstance(args, trl.GRPOConfig):
        beta, G, w = _check_common(args, task)
        divergence, scale = _grpo_settings(args)
        table = loss_fixed_point_table(
            task.space, task.ref_table, w * scores, beta, divergence=divergence, group_size=G, scale=scale
        )
        return ex.sequence_logprobs(task.space, table)
    if isinstance(args, trl.RLOOConfig):
        beta, _, w = _check_common(args, task)
        _require(args, "reward_clip_range", args.reward_clip_range is None, "None (no reward clipping)")
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
    beta, G, w = _check_common(args, task)
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
    """The callback's numbers from per-token tensors (B, T) of sampled completions: the exact KL (per
    sequence and per token), k1 and k3 per sequence with their standard errors, the gap's z, the exact-KL
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


class KLMonitorCallback(transformers.TrainerCallback):
    r"""Every ``every`` steps, sample completions of fixed prompts from the policy and log the library's
    exact KL beside TRL's own ``kl``.

    It samples ``samples_per_prompt`` completions of each prompt (``max_new_tokens`` tokens at most, stopping
    at the tokenizer's EOS; temperature 1, no top-k or top-p, from a seeded generator in a forked RNG, so
    training's random stream is untouched), scores them under the policy and the reference, and computes
    per token the log-probs of the sampled tokens, the exact KL of the two next-token distributions
    (:func:`~kltutorial.logprobs.exact_kl`) and the policy's exact entropy; then
    :func:`monitor_statistics`. Under several processes (``accelerate launch``) each rank samples its share
    of the prompts (prompt ``i`` on rank ``i mod R``), the per-token tensors are gathered, and every rank
    computes the same numbers from all of them (a rank may hold more prompts than another, or none). Not
    under DeepSpeed ZeRO-3 or FSDP, whose sharded parameters need every rank in every forward pass, while
    here each rank generates for its own prompts only.

    The numbers are logged with ``trainer.log``, prefixed ``kltutorial/``, so every ``report_to`` sink gets
    them; a TRL trainer's ``log`` adds its own metrics averaged since its last log, ``kl`` among them, to the
    same record. They are also kept in ``history``, one dict per monitored step. TRL's GRPO ``kl`` is
    the mean per-token k3 of its training batch (weighted by the importance ratio, 1 on policy, when
    ``use_bias_correction_kl``), RLOO's the mean per-token k1: compare them with ``k3_per_token`` and
    ``exact_kl_per_token``.

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
        self.trainer, self.ref_model = trainer, ref
        self.prompts, self.samples_per_prompt = list(prompts), samples_per_prompt
        self.max_new_tokens, self.every, self.seed = max_new_tokens, every, seed
        self.history: list[dict[str, float]] = []

    # -- the callback's events
    def on_train_begin(self, args, state, control, **kwargs):
        self._monitor(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self._monitor(state.global_step)

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
        return _sample_completions(model, ref, tok, mine, self.samples_per_prompt, self.max_new_tokens,
                                   seed=hash((self.seed, step, rank)) % (2**63))

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
        was_training = self.trainer.model.training
        stats = self.statistics(self.sample(step))
        if was_training:
            self.trainer.model.train()
        self.history.append({"step": step, **stats})
        self.trainer.log({f"kltutorial/{k}": v for k, v in stats.items()})


@torch.no_grad()
def _sample_completions(model: torch.nn.Module, ref: torch.nn.Module, tok: Any, prompts: Sequence[str],
                        n: int, max_new_tokens: int, *, seed: int) -> MonitorSample:
    device = next(model.parameters()).device
    model.eval()
    T = max_new_tokens
    parts = []
    for prompt in prompts:
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids.to(device)  # (1, L)
        prompt_ids = ids.expand(n, -1)
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
            torch.manual_seed(seed)
            seed = (seed * 6364136223846793005 + 1442695040888963407) % (2**63)
            out = model.generate(
                input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=True,
                temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=T, min_new_tokens=0,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            )
        completion = out[:, ids.shape[1] :]  # (n, <= T)
        if completion.shape[1] < T:
            pad = torch.full((n, T - completion.shape[1]), tok.pad_token_id, dtype=completion.dtype,
                             device=device)
            completion = torch.cat([completion, pad], dim=1)
        # a completion's tokens: up to and including its first EOS (as TRL's completion mask)
        is_eos = completion == tok.eos_token_id
        after = (is_eos.cumsum(-1) - is_eos.long()) > 0
        mask = ~after
        full = torch.cat([prompt_ids, completion], dim=1)
        attn = torch.cat([torch.ones_like(prompt_ids), mask.long()], dim=1)
        L = ids.shape[1]
        lp = torch.log_softmax(model(input_ids=full, attention_mask=attn).logits[:, L - 1 : -1].float(), -1)
        lq = torch.log_softmax(ref(input_ids=full, attention_mask=attn).logits[:, L - 1 : -1].float(), -1)
        token = completion.unsqueeze(-1)
        parts.append(MonitorSample(
            tokens=completion.cpu(),
            policy=lp.gather(-1, token).squeeze(-1).double().cpu(),
            reference=lq.gather(-1, token).squeeze(-1).double().cpu(),
            kl=exact_kl(lp, lq, mask).double().cpu(),
            entropy=entropy(lp).double().cpu(),
            mask=mask.cpu(),
        ))
    if not parts:  # a rank that holds none of the prompts (more processes than prompts)
        empty = torch.empty(0, T, dtype=torch.float64)
        return MonitorSample(torch.empty(0, T, dtype=torch.long), empty, empty, empty, empty,
                             torch.empty(0, T, dtype=torch.bool))
    fields = ("tokens", "policy", "reference", "kl", "entropy", "mask")
    return MonitorSample(*(torch.cat([getattr(s, f) for s in parts]) for f in fields))
