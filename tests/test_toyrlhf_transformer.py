"""Tests of kltutorial.toyrlhf.transformer (book section 11): the causal transformer policy (normalised,
causal, its table equal to its forward pass, reproducible from its generator), its argument checks, the fit
to the reference chain by enumeration, and distillation towards the exact optimum pi*_beta."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from kltutorial import exact as ex
from kltutorial import toyrlhf as toy
from kltutorial.toyrlhf.transformer import TransformerPolicy, distill, fit_reference, sequence_logprobs_of


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def task(toy_task) -> toy.ToyTask:
    return toy_task


@pytest.fixture(scope="module")
def fitted(task: toy.ToyTask) -> tuple[TransformerPolicy, float]:
    """The default network fitted to the reference chain, and the KL it returned."""
    policy = TransformerPolicy(task.space, generator=_gen(0))
    return policy, fit_reference(policy, task.ref_table, tol=1e-3)


def _perturbed(space: ex.SequenceSpace, seed: int = 0) -> TransformerPolicy:
    """A network far from its initialisation (weights moved by 0.3 x N(0, 1)): attention not uniform."""
    policy = TransformerPolicy(space, generator=_gen(seed))
    g = _gen(seed + 1000)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype, generator=g))
    return policy


def _random_sequences(space: ex.SequenceSpace, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(space.vocab_size, (n, space.length), generator=_gen(seed))


# --- the network ----------------------------------------------------------------------------------


def test_forward_gives_normalised_float64_log_probs_and_values_one_per_position(task: toy.ToyTask) -> None:
    policy = _perturbed(task.space)
    y = _random_sequences(task.space, 64)
    with torch.no_grad():
        logp, values = policy(y), policy.values(y)
    assert logp.shape == (64, 5, 8) and logp.dtype == torch.float64
    assert torch.allclose(torch.logsumexp(logp, dim=-1), torch.zeros(64, 5, dtype=torch.float64), atol=1e-12)
    assert values.shape == (64, 5) and values.dtype == torch.float64
    assert values.std() > 0  # the value head reads the state, not a constant
    assert logp[:, 0].std(0).max() < 1e-12  # position 0 sees only BOS: the same row for every sequence
    assert logp[:, 1:].std(0).max() > 1e-3


def test_position_t_does_not_see_token_t_or_later(task: toy.ToyTask) -> None:
    policy = _perturbed(task.space)
    y = _random_sequences(task.space, 32)
    with torch.no_grad():
        base, base_values = policy(y), policy.values(y)
        for t in range(task.space.length):
            changed = y.clone()
            changed[:, t] = (changed[:, t] + 1) % task.space.vocab_size
            out, values = policy(changed), policy.values(changed)
            assert torch.equal(out[:, : t + 1], base[:, : t + 1]), t  # positions <= t: unchanged
            assert torch.equal(values[:, : t + 1], base_values[:, : t + 1]), t
            if t + 1 < task.space.length:
                assert (out[:, t + 1] - base[:, t + 1]).abs().max() > 1e-6, t  # position t + 1 reads y_t


def test_table_agrees_with_forward_row_by_row(task: toy.ToyTask) -> None:
    space = task.space
    policy = _perturbed(space)
    idx = torch.randint(space.n_sequences, (256,), generator=_gen(3))
    with torch.no_grad():
        table, out = policy.table(), policy(space.sequences[idx])
    assert table.shape == (space.n_prefixes, space.vocab_size) and table.dtype == torch.float64
    assert torch.allclose(table[space.prefix_ids[idx]], out, atol=1e-12, rtol=0)
    # the chain rule through the table is the sum of forward's token log-probs
    with torch.no_grad():
        y = space.sequences[idx]
        direct = policy(y).gather(-1, y[..., None])[..., 0].sum(-1)  # (256,)
    logp = sequence_logprobs_of(policy)
    assert torch.allclose(logp[idx], direct, atol=1e-11, rtol=0)
    assert abs(float(torch.logsumexp(logp, 0))) < 1e-12
    assert not logp.requires_grad


def test_table_is_differentiable(task: toy.ToyTask) -> None:
    policy = TransformerPolicy(task.space, generator=_gen(0))
    policy.table()[:, 0].sum().backward()
    missing = [name for name, p in policy.named_parameters() if p.grad is None]
    assert missing == ["value_head.weight", "value_head.bias"]  # every other parameter shapes the table
    assert policy.policy_head.weight.grad.abs().sum() > 0 and policy.embed.weight.grad.abs().sum() > 0


def test_the_generator_alone_sets_the_parameters(task: toy.ToyTask) -> None:
    state = torch.random.get_rng_state()
    a = TransformerPolicy(task.space, generator=_gen(5))
    b = TransformerPolicy(task.space, generator=_gen(5))
    c = TransformerPolicy(task.space, generator=_gen(6))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is neither used nor seeded
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(p.dtype == torch.float64 for p in pa.values())
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa["embed.weight"], pc["embed.weight"])
    assert not torch.equal(pa["blocks.0.qkv.weight"], pc["blocks.0.qkv.weight"])
    assert a.space is task.space


def test_sizes_are_configurable(task: toy.ToyTask) -> None:
    small = TransformerPolicy(task.space, width=16, layers=1, heads=4, generator=_gen(0))
    assert len(small.blocks) == 1 and small.embed.weight.shape == (9, 16)
    y = _random_sequences(task.space, 8)
    with torch.no_grad():
        assert torch.allclose(small.table()[task.space.prefix_ids[:8]], small(task.space.sequences[:8]))
        assert small(y).shape == (8, 5, 8)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"space": "abc"}, TypeError, "space"),
        ({"width": 30, "heads": 4}, ValueError, "width"),
        ({"width": 0}, ValueError, "width"),
        ({"layers": 1.5}, TypeError, "layers"),
        ({"heads": 0}, ValueError, "heads"),
        ({"generator": 0}, TypeError, "generator"),
        ({"generator": np.random.default_rng(0)}, TypeError, "generator"),
    ],
)
def test_bad_arguments_raise_and_name_the_argument(task, kwargs, error, name) -> None:
    args = {"space": task.space, "generator": _gen(0)} | kwargs
    space = args.pop("space")
    with pytest.raises(error, match=name):
        TransformerPolicy(space, **args)


def test_bad_sequences_raise(task: toy.ToyTask) -> None:
    policy = TransformerPolicy(task.space, generator=_gen(0))
    with pytest.raises(ValueError, match="sequences"):
        policy(torch.zeros(4, 3, dtype=torch.long))  # T = 3, not 5
    with pytest.raises(ValueError, match="sequences"):
        policy(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="sequences"):
        policy(torch.full((2, 5), 8))  # token 8 is BOS, not an input
    with pytest.raises(TypeError, match="sequences"):
        policy.values(torch.zeros(2, 5))


# --- fitting and distilling by enumeration --------------------------------------------------------


def test_fit_reference_reaches_the_tolerance(task: toy.ToyTask, fitted) -> None:
    policy, kl = fitted
    assert 0 <= kl <= 1e-3
    assert kl == pytest.approx(ex.sequence_kl(task.ref_logprobs, sequence_logprobs_of(policy)), abs=1e-12)
    # the network is now close to the reference chain at every prefix that carries mass
    gap = (policy.table().detach().exp() - task.ref_table.exp()).abs()
    assert gap[: 1 + 8].max() < 0.05


def test_fit_reference_raises_when_it_runs_out_of_steps(task: toy.ToyTask) -> None:
    policy = TransformerPolicy(task.space, width=16, layers=1, generator=_gen(0))
    with pytest.raises(RuntimeError, match="max_steps=2"):
        fit_reference(policy, task.ref_table, max_steps=2)


def test_fit_reference_and_distill_check_their_arguments(task: toy.ToyTask) -> None:
    policy = TransformerPolicy(task.space, width=16, layers=1, generator=_gen(0))
    with pytest.raises(TypeError, match="policy"):
        fit_reference(object(), task.ref_table)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ref_table"):
        fit_reference(policy, task.ref_table[:10])
    with pytest.raises(ValueError, match="tol"):
        fit_reference(policy, task.ref_table, tol=0.0)
    with pytest.raises(ValueError, match="target_logprobs"):
        distill(policy, task.ref_logprobs[:100])
    with pytest.raises(ValueError, match="target_logprobs"):  # a zero of the target: infinite reverse KL
        distill(policy, torch.where(task.proxy_reward > 0, task.ref_logprobs, -torch.inf))
    with pytest.raises(ValueError, match="target_logprobs"):  # not normalised
        distill(policy, task.ref_logprobs + 1.0)
    with pytest.raises(ValueError, match="steps"):
        distill(policy, task.ref_logprobs, steps=0)


def test_distill_towards_the_optimum_lowers_the_exact_kl(task: toy.ToyTask, fitted) -> None:
    target = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, 0.3)
    policy = copy.deepcopy(fitted[0])
    before = ex.sequence_kl(sequence_logprobs_of(policy), target)
    kl = distill(policy, target, steps=20, lr=1e-2)
    after = sequence_logprobs_of(policy)
    assert kl == pytest.approx(ex.sequence_kl(after, target), abs=1e-12)
    assert kl < 0.5 * before
    # the copy moved, the fitted network did not
    assert ex.sequence_kl(sequence_logprobs_of(fitted[0]), target) == pytest.approx(before, abs=1e-12)
    assert ex.sequence_kl(after, task.ref_logprobs) > 0.5  # it left the reference for the proxy's optimum
