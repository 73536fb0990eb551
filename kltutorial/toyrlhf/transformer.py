r"""A small causal transformer policy for the toy task, fitted to the reference chain (book section 11).

The table policy of :mod:`~kltutorial.toyrlhf.trainer` can represent every distribution over sequences;
a neural policy cannot, and shares its parameters across prefixes as a language model does. To keep
:math:`\pi^*_\beta(y) \propto \pi_\mathrm{ref}(y)\, e^{r(y)/\beta}` exact for it, the reference of the
neural run is the fitted network itself: :func:`fit_reference` fits :class:`TransformerPolicy` to the
task's reference chain by enumeration, and its own next-token table (:meth:`TransformerPolicy.table`)
is then :math:`\pi_\mathrm{ref}`. :func:`distill` measures what the architecture can reach: the smallest
:math:`\mathrm{KL}(\pi_\theta \| \pi^*_\beta)` it finds from the fitted weights.

The network is nanoGPT-like, from ``torch.nn`` only: a BOS token (id V) before the sequence, token and
learned position embeddings, ``layers`` pre-LayerNorm blocks of causal self-attention and an MLP, a final
LayerNorm, a policy head to V logits and a value head to one scalar. Every parameter is float64 and drawn
from the ``torch.Generator`` passed in, so its outputs are reproducible and its exact sums compare with
the tables' of :mod:`kltutorial.exact`.

Shapes: N sequences, T = 5 positions, V = 8 tokens, D width, P = 4681 prefixes, V**T = 32,768 sequences.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import exact as ex
from .._validation import (
    check_float_tensor,
    check_generator,
    check_positive,
    check_positive_int,
    check_token_ids,
)

__all__ = ["TRANSFORMER_LR", "TransformerPolicy", "fit_reference", "distill", "sequence_logprobs_of"]

#: Adam's learning rate for training the network with a recipe (the table policy's 0.1 would not suit it):
#: ``ppo-k1-reward`` at beta = 0.3 ends about 0.013 nats from its fixed point after 100 steps with it.
TRANSFORMER_LR: float = 1e-3

_DTYPE = torch.float64


class _Block(nn.Module):
    """One pre-LayerNorm block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``; attention is causal."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, dtype=_DTYPE)
        self.qkv = nn.utils.skip_init(nn.Linear, width, 3 * width, dtype=_DTYPE)  # initialised by the policy
        self.proj = nn.utils.skip_init(nn.Linear, width, width, dtype=_DTYPE)
        self.ln2 = nn.LayerNorm(width, dtype=_DTYPE)
        self.fc = nn.utils.skip_init(nn.Linear, width, 4 * width, dtype=_DTYPE)
        self.out = nn.utils.skip_init(nn.Linear, 4 * width, width, dtype=_DTYPE)

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """States ``x`` (N, L, D) at L consecutive positions after the S positions of ``past``, the keys and
        values (N, S, D) of those positions (none: S = 0). Returns the new states and x's keys and values."""
        N, L, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)  # 3 x (N, L, D)
        keys, vals = (k, v) if past is None else (torch.cat([past[0], k], 1), torch.cat([past[1], v], 1))
        S, H = keys.shape[1] - L, self.heads
        q, kh, vh = (z.view(N, z.shape[1], H, D // H) for z in (q, keys, vals))  # (N, ., H, D/H)
        if L == 1:  # one query that sees every key: products and sums beat tiny batched matmuls
            weights = ((q * kh).sum(-1) / math.sqrt(D // H)).softmax(dim=1)  # (N, S + 1, H)
            attn = (weights[..., None] * vh).sum(1).view(N, 1, D)  # (N, 1, D)
        else:
            q, kh, vh = (z.transpose(1, 2) for z in (q, kh, vh))  # (N, H, ., D/H)
            scores = q @ kh.transpose(-2, -1) / math.sqrt(D // H)  # (N, H, L, S + L)
            future = torch.ones(L, S + L, dtype=torch.bool, device=x.device).triu(S + 1)  # key after query
            attn = scores.masked_fill(future, -math.inf).softmax(dim=-1) @ vh  # (N, H, L, D/H)
            attn = attn.transpose(1, 2).reshape(N, L, D)  # (N, L, D)
        x = x + self.proj(attn)
        return x + self.out(torch.relu(self.fc(self.ln2(x)))), (k, v)  # (N, L, D)


class TransformerPolicy(nn.Module):
    r"""A causal transformer over the sequences of ``space``: next-token log-probs and a value per position.

    Position t reads BOS, :math:`y_0, \dots, y_{t-1}` and gives :math:`\log \pi_\theta(\cdot \mid y_{<t})`
    and the value :math:`V(y_{<t})` of the state before token t.

    Parameters
    ----------
    space : SequenceSpace
        The sequences (V tokens, T positions) the policy is over.
    width : int
        D, the residual width (a multiple of ``heads``); up to 64 keeps :func:`fit_reference` fast.
    layers : int
        Transformer blocks.
    heads : int
        Attention heads per block.
    generator : torch.Generator
        Draws every parameter: embeddings and linear weights normal with std 0.02 (the output projections
        of each block 0.02 / sqrt(2 ``layers``), as GPT-2), heads std 0.02; biases 0, LayerNorms 1 and 0.

    Attributes
    ----------
    space : SequenceSpace
    """

    def __init__(
        self, space: ex.SequenceSpace, *, width: int = 32, layers: int = 2, heads: int = 2,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        if not isinstance(space, ex.SequenceSpace):
            raise TypeError(f"space must be a SequenceSpace (e.g. task.space), got {type(space).__name__}")
        width = check_positive_int(width, "width")
        layers = check_positive_int(layers, "layers")
        heads = check_positive_int(heads, "heads")
        if width % heads:
            raise ValueError(f"width must be divisible by heads, got width={width} and heads={heads}")
        check_generator(generator)
        self.space = space
        V, T = space.vocab_size, space.length
        self.embed = nn.utils.skip_init(nn.Embedding, V + 1, width, dtype=_DTYPE)  # token V is BOS
        self.position = nn.Parameter(torch.empty(T, width, dtype=_DTYPE))
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, dtype=_DTYPE)
        self.policy_head = nn.utils.skip_init(nn.Linear, width, V, dtype=_DTYPE)
        self.value_head = nn.utils.skip_init(nn.Linear, width, 1, dtype=_DTYPE)
        with torch.no_grad():  # in the fixed order of named_modules: the same generator, the same weights
            for name, module in self.named_modules():
                if isinstance(module, nn.Linear):
                    residual = name.endswith((".proj", ".out"))  # the blocks' writes to the residual stream
                    std = 0.02 / math.sqrt(2 * layers) if residual else 0.02
                    nn.init.normal_(module.weight, std=std, generator=generator)
                    nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding):
                    nn.init.normal_(module.weight, std=0.02, generator=generator)
            nn.init.normal_(self.position, std=0.02, generator=generator)

    def _hidden(self, sequences: torch.Tensor) -> torch.Tensor:
        """The final-LayerNorm states before each token: input BOS, y_0, ..., y_{T-2}. (N, T) -> (N, T, D)."""
        bos = torch.full_like(sequences[:, :1], self.space.vocab_size)  # (N, 1)
        tokens = torch.cat([bos, sequences[:, :-1]], dim=1)  # (N, T)
        x = self.embed(tokens) + self.position  # (N, T, D)
        for block in self.blocks:
            x, _ = block(x)
        return self.ln_f(x)  # (N, T, D)

    def _prefix_hidden(self) -> torch.Tensor:
        """The final-LayerNorm state of every prefix row, (P, D): level by level, as a tree.

        The V**t prefixes of length t are one query each, attending to the keys and values cached for
        their ancestors (the prefix of length s < t of code c is c // V**(t - s)): P positions in all, where
        a causal pass over the V**(T-1) sequences that contain them computes T V**(T-1) (4.4 times more).
        """
        V, T = self.space.vocab_size, self.space.length
        cache: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.blocks]  # [block][level]
        levels = []
        for t in range(T):
            code = torch.arange(V**t)  # (V**t,): the prefix read in base V, its row offsets[t] + code
            token = torch.full_like(code, V) if t == 0 else code % V  # the input at position t: y_{t-1}
            x = (self.embed(token) + self.position[t])[:, None]  # (V**t, 1, D)
            for block, kv in zip(self.blocks, cache, strict=True):
                past = None
                if t > 0:  # ancestors' keys and values: a level-s row's V**(t-s) descendants are consecutive
                    past = tuple(
                        torch.cat([kv[s][i].repeat_interleave(V ** (t - s), dim=0) for s in range(t)], dim=1)
                        for i in (0, 1)
                    )  # (V**t, t, D) each
                x, new = block(x, past)
                kv.append(new)  # (V**t, 1, D) each
            levels.append(self.ln_f(x[:, 0]))
        return torch.cat(levels)  # (P, D), in the row order of a next-token table

    def _check_sequences(self, sequences: object) -> torch.Tensor:
        if isinstance(sequences, torch.Tensor) and sequences.dim() != 2:
            raise ValueError(
                f"sequences must have shape (N, {self.space.length}), got {tuple(sequences.shape)}"
            )
        n = sequences.shape[0] if isinstance(sequences, torch.Tensor) else 0
        return check_token_ids(
            sequences, "sequences", torch.Size([n, self.space.length]), self.space.vocab_size
        )

    def forward(self, sequences: torch.Tensor) -> torch.Tensor:
        r"""Next-token log-probs :math:`\log \pi_\theta(v \mid y_{<t})` at every position of each sequence.

        Parameters
        ----------
        sequences : Tensor, shape (N, T), int64
            Tokens in ``[0, V)``; position t sees only :math:`y_{<t}` (``y_t`` and later do not matter).

        Returns
        -------
        Tensor, shape (N, T, V), float64
            Each row normalised (its logsumexp is 0).
        """
        sequences = self._check_sequences(sequences)
        return torch.log_softmax(self.policy_head(self._hidden(sequences)), dim=-1)  # (N, T, V)

    def values(self, sequences: torch.Tensor) -> torch.Tensor:
        r"""The value head :math:`V(y_{<t})` at every position: the state before token t.

        Parameters
        ----------
        sequences : Tensor, shape (N, T), int64

        Returns
        -------
        Tensor, shape (N, T), float64
        """
        sequences = self._check_sequences(sequences)
        return self.value_head(self._hidden(sequences)).squeeze(-1)  # (N, T)

    def table(self) -> torch.Tensor:
        r"""The next-token table of the policy, ``table[h, v]`` :math:`= \log \pi_\theta(v \mid h)`.

        The same numbers as :meth:`forward` (``table[space.prefix_ids[i, t]]`` is ``forward(sequences)[i,
        t]`` for ``sequences = space.sequences``), computed once per prefix: the P prefixes, level by level,
        each attending to its ancestors' cached keys and values. Differentiable.

        Returns
        -------
        Tensor, shape (P, V), float64
            The layout of ``task.ref_table``, for :func:`~kltutorial.exact.sequence_logprobs`.
        """
        return torch.log_softmax(self.policy_head(self._prefix_hidden()), dim=-1)  # (P, V)


def _check_policy(policy: object) -> TransformerPolicy:
    if not isinstance(policy, TransformerPolicy):
        raise TypeError(f"policy must be a TransformerPolicy, got {type(policy).__name__}")
    return policy


def _prefix_logprobs(space: ex.SequenceSpace, table: torch.Tensor) -> torch.Tensor:
    """log π(h) for every prefix row h, level by level: log π(hv) = log π(h) + log π(v | h). (P,)"""
    o, levels = space.offsets, [table.new_zeros(1)]  # the empty prefix has probability 1
    for L in range(1, space.length):
        parents = table[o[L - 1] : o[L]]  # (V**(L-1), V): row h, column v gives the child hv (code h V + v)
        levels.append((levels[-1][:, None] + parents).reshape(-1))  # (V**L,)
    return torch.cat(levels)  # (P,)


def sequence_logprobs_of(policy: TransformerPolicy) -> torch.Tensor:
    r"""Exact :math:`\log \pi_\theta(y)` of every sequence: the chain rule over the policy's table.

    Returns
    -------
    Tensor, shape (V**T,), float64, detached
    """
    policy = _check_policy(policy)
    with torch.no_grad():
        return ex.sequence_logprobs(policy.space, policy.table())


def fit_reference(
    policy: TransformerPolicy, ref_table: torch.Tensor, *, max_steps: int = 500, lr: float = 1e-2,
    tol: float = 1e-3,
) -> float:
    r"""Fit ``policy`` to a reference by enumeration: minimise the exact :math:`\mathrm{KL}(\pi_\mathrm{ref}
    \| \pi_\theta)`, in place.

    By the chain rule of KL the loss is a sum over the P prefix rows,

    .. math:: \mathrm{KL}(\pi_\mathrm{ref} \| \pi_\theta) = \sum_h \pi_\mathrm{ref}(h)\,
              \sum_v \pi_\mathrm{ref}(v \mid h) \log \frac{\pi_\mathrm{ref}(v \mid h)}{\pi_\theta(v \mid h)},

    with the prefix masses :math:`\pi_\mathrm{ref}(h)` from ``ref_table``: the loss is the exact sequence KL,
    not an estimate. Full-batch Adam (deterministic, no sampling), stopping at the first step where it is
    at most ``tol``.

    Parameters
    ----------
    policy : TransformerPolicy
        Changed in place.
    ref_table : Tensor, shape (P, V)
        Next-token log-probs of the reference (``task.ref_table``), finite.
    max_steps : int
    lr : float
        Adam's learning rate, constant (a decay only slows the fit down).
    tol : float
        Nats.

    Returns
    -------
    float
        The exact :math:`\mathrm{KL}(\pi_\mathrm{ref} \| \pi_\theta)` over the V**T sequences, <= ``tol``.

    Raises
    ------
    RuntimeError
        If ``max_steps`` pass without reaching ``tol`` (the message gives the KL reached).
    """
    policy = _check_policy(policy)
    space = policy.space
    ref_table = check_float_tensor(ref_table, "ref_table", ndim=2)
    if tuple(ref_table.shape) != (space.n_prefixes, space.vocab_size):
        raise ValueError(
            f"ref_table must have shape {(space.n_prefixes, space.vocab_size)}, got {tuple(ref_table.shape)}"
        )
    max_steps = check_positive_int(max_steps, "max_steps")
    lr, tol = check_positive(lr, "lr"), check_positive(tol, "tol")
    ref_table = ref_table.to(_DTYPE)
    ref_logprobs = ex.sequence_logprobs(space, ref_table)  # (V**T,), checks the rows are normalised
    weight = _prefix_logprobs(space, ref_table).exp()[:, None] * ref_table.exp()  # (P, V): pi_ref(h v)
    entropy_term = (weight * ref_table).sum()  # sum_h pi_ref(h) sum_v ref(v|h) log ref(v|h)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    for _ in range(max_steps):
        loss = entropy_term - (weight * policy.table()).sum()  # exact KL(pi_ref || pi_theta)
        if loss.item() <= tol:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    kl = ex.sequence_kl(ref_logprobs, sequence_logprobs_of(policy))
    if kl > tol:
        raise RuntimeError(
            f"fit_reference reached KL(pi_ref || pi_theta) = {kl:.3g} nats after max_steps={max_steps}, "
            f"above tol={tol:g}; raise max_steps, change lr, or widen the network"
        )
    return kl


def distill(
    policy: TransformerPolicy, target_logprobs: torch.Tensor, *, steps: int = 200, lr: float = 1e-2
) -> float:
    r"""Distil a target distribution into ``policy`` by enumeration: minimise the exact reverse KL, in place.

    .. math:: \mathrm{KL}(\pi_\theta \| p) = \sum_y \pi_\theta(y) \bigl(\log \pi_\theta(y) - \log p(y)\bigr),

    differentiated through :math:`\pi_\theta(y) = \exp \sum_t \log \pi_\theta(y_t \mid y_{<t})` from
    :meth:`~TransformerPolicy.table`, full-batch Adam from the policy's current weights (pass a copy of
    the network fitted to the reference). The lowest KL found bounds the architecture's floor for the
    target from above, e.g. for :math:`p = \pi^*_\beta`: the best a policy of this shape can do. It is
    still falling after the default 200 steps (about 17 s on one CPU thread for the default network and
    task), slowly: for :math:`\pi^*_{0.3}` of the task of book section 11 about 2e-3 nats after 200 steps
    and 4e-4 after 400; for :math:`\pi^*_{0.1}`, 0.016 and 0.007.

    Parameters
    ----------
    policy : TransformerPolicy
        Changed in place; left at the best weights seen.
    target_logprobs : Tensor, shape (V**T,)
        :math:`\log p(y)`, finite (a softmax policy puts mass everywhere, so a zero of p makes the KL
        infinite) and normalised.
    steps : int
        Adam steps; the learning rate decays linearly to 0 over the second half.
    lr : float

    Returns
    -------
    float
        The exact :math:`\mathrm{KL}(\pi_\theta \| p)` (nats) of the policy as returned.
    """
    policy = _check_policy(policy)
    space = policy.space
    target = check_float_tensor(target_logprobs, "target_logprobs", ndim=1)
    if target.shape[0] != space.n_sequences:
        raise ValueError(
            f"target_logprobs must have shape ({space.n_sequences},), got {tuple(target.shape)}"
        )
    steps, lr = check_positive_int(steps, "steps"), check_positive(lr, "lr")
    target = target.to(_DTYPE)
    off = float(torch.logsumexp(target, dim=0))
    if abs(off) > 1e-8:
        raise ValueError(
            f"target_logprobs must be normalised log-probabilities (logsumexp 0), got logsumexp {off:.3g}"
        )
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    half = steps // 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s < half else max(0.0, (steps - s) / (steps - half))
    )
    best, best_state = math.inf, None
    for step in range(steps + 1):
        logp = ex.sequence_logprobs(space, policy.table())  # (V**T,), differentiable
        loss = (logp.exp() * (logp - target)).sum()  # exact KL(pi_theta || p)
        if loss.item() < best:
            best, best_state = loss.item(), {k: v.detach().clone() for k, v in policy.state_dict().items()}
        if step == steps:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    policy.load_state_dict(best_state)
    return ex.sequence_kl(sequence_logprobs_of(policy), target)
