"""Tests of kltutorial.toyrlhf (book section 11): exact helpers against closed forms, the proxy's
fit, and the trainer against the exact optimum pi*_beta."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kltutorial import AdaptiveKLController
from kltutorial import toyrlhf as toy


@pytest.fixture(scope="module")
def task() -> toy.ToyTask:
    return toy.make_task(seed=0, n_pairs=100)


def _logz(task: toy.ToyTask, beta: float) -> float:
    return float(torch.logsumexp(task.ref_logprobs + task.proxy_reward / beta, 0))


# --- the task -------------------------------------------------------------------------------


def test_task_enumerates_every_sequence_once(task: toy.ToyTask) -> None:
    assert task.sequences.shape == (toy.S, toy.T) == (32768, 5)
    assert task.sequences.dtype == torch.int64
    assert torch.unique(task.sequences, dim=0).shape[0] == toy.S
    for name in ("ref_logprobs", "gold_reward", "proxy_reward"):
        assert getattr(task, name).shape == (toy.S,)
    assert abs(float(task.ref_logprobs.exp().sum()) - 1.0) < 1e-12


def test_reference_is_the_markov_chain(task: toy.ToyTask) -> None:
    assert torch.allclose(task.ref_transition.sum(1), torch.ones(toy.V, dtype=torch.float64))
    rng = np.random.default_rng(1)
    for i in rng.integers(0, toy.S, size=20):
        y = task.sequences[i]
        logp = task.ref_initial[y[0]].log() + sum(
            task.ref_transition[y[t - 1], y[t]].log() for t in range(1, toy.T)
        )
        assert abs(float(logp - task.ref_logprobs[i])) < 1e-12


def test_bang_is_rare_and_gold_saturates(task: toy.ToyTask) -> None:
    multi = toy.bang_count_distribution(task, task.ref_logprobs)[2:].sum()
    assert 0.02 < multi < 0.1  # "a few percent" of the reference mass
    # Gold reward differences in closed form (none of these sequences has a repeated neighbour).
    idx = {s: int(np.ravel_multi_index([toy.VOCAB.index(c) for c in s], (toy.V,) * toy.T))
           for s in ("abcde", "abcd!", "ab!c!")}
    g = task.gold_reward
    w = task.gold_token_weights
    # "e" -> "!": lose w_e, gain the bonus 3; "d" -> a second "!": lose w_d, pay the penalty 1.5.
    assert float(g[idx["abcd!"]] - g[idx["abcde"]]) == pytest.approx(3.0 - float(w[4]), abs=1e-12)
    assert float(g[idx["ab!c!"]] - g[idx["abcd!"]]) == pytest.approx(-1.5 - float(w[3]), abs=1e-12)
    assert task.decode(idx["ab!c!"]) == "ab!c!"


def test_proxy_fits_its_pairs_and_fails_where_data_is_thin(task: toy.ToyTask) -> None:
    a, b = task.pairs[:, 0], task.pairs[:, 1]
    predicted = task.proxy_reward[a] > task.proxy_reward[b]
    accuracy = float((predicted == task.pair_labels).double().mean())
    assert accuracy > 0.6  # better than chance on its own (noisy) training labels
    gen = torch.Generator().manual_seed(0)
    overall = toy.ranking_agreement(task, 20_000, gen)
    thin = toy.ranking_agreement(task, 20_000, gen, min_bangs=2)
    assert overall > 0.7 and thin < overall - 0.05
    # With few pairs the proxy extrapolates: each "!" beats every other token.
    assert task.proxy_weights[toy.BANG] > task.proxy_weights[: toy.BANG].max()


def test_same_seed_same_task_and_data_seed_changes_only_the_data() -> None:
    t1, t2 = toy.make_task(seed=3, n_pairs=50), toy.make_task(seed=3, n_pairs=50)
    assert torch.equal(t1.proxy_reward, t2.proxy_reward)
    t3 = toy.make_task(seed=3, n_pairs=50, data_seed=1)
    assert torch.equal(t1.ref_logprobs, t3.ref_logprobs) and torch.equal(t1.gold_reward, t3.gold_reward)
    assert not torch.equal(t1.proxy_reward, t3.proxy_reward)


# --- exact helpers --------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_optimal_policy_closed_form(task: toy.ToyTask, beta: float) -> None:
    logp = toy.exact_optimal_policy(task, beta)
    assert abs(float(logp.exp().sum()) - 1.0) < 1e-12
    kl = toy.sequence_kl(logp, task.ref_logprobs)
    reward = toy.expected_reward(logp, task.proxy_reward)
    # KL(pi* || pi_ref) = E*[r] / beta - log Z
    assert abs(kl - (reward / beta - _logz(task, beta))) < 1e-9
    # pi* maximises E[r] - beta KL: better than pi_ref and than the optimum of another beta.
    j_opt = reward - beta * kl
    for other in (task.ref_logprobs, toy.exact_optimal_policy(task, 2 * beta)):
        j = toy.expected_reward(other, task.proxy_reward) - beta * toy.sequence_kl(other, task.ref_logprobs)
        assert j < j_opt


def test_sequence_kl_properties(task: toy.ToyTask) -> None:
    p = toy.exact_optimal_policy(task, 0.3)
    assert toy.sequence_kl(p, p) == pytest.approx(0.0, abs=1e-12)
    assert toy.sequence_kl(p, task.ref_logprobs) > 0
    assert toy.sequence_kl(p, task.ref_logprobs) != pytest.approx(toy.sequence_kl(task.ref_logprobs, p))


def test_frontier_is_monotone_in_beta(task: toy.ToyTask) -> None:
    f = toy.exact_frontier(task, [2.0, 1.0, 0.5, 0.2, 0.1])
    assert np.all(np.diff(f.kl) > 0) and np.all(np.diff(f.proxy) > 0)


@pytest.mark.parametrize("n", [1, 2, 16, 256])
def test_best_of_n(task: toy.ToyTask, n: int) -> None:
    logp = toy.best_of_n_logprobs(task, n)
    assert abs(float(logp.exp().sum()) - 1.0) < 1e-9
    kl = toy.sequence_kl(logp, task.ref_logprobs)
    assert kl <= toy.best_of_n_kl_bound(n) + 1e-9
    # P(best score <= r) = F(r)^n at every distinct score r.
    r = task.proxy_reward
    values, group = torch.unique(r, return_inverse=True)
    ref_mass = torch.zeros(len(values), dtype=torch.float64).index_add_(0, group, task.ref_logprobs.exp())
    bon_mass = torch.zeros(len(values), dtype=torch.float64).index_add_(0, group, logp.exp())
    assert torch.allclose(bon_mass.cumsum(0), ref_mass.cumsum(0).clamp(max=1) ** n, atol=1e-9)
    if n == 1:
        assert torch.allclose(logp, task.ref_logprobs, atol=1e-9)


def test_best_of_n_without_ties_approaches_the_formula(task: toy.ToyTask) -> None:
    scores = torch.randperm(toy.S, generator=torch.Generator().manual_seed(0)).to(torch.float64)
    untied = dataclasses.replace(task, proxy_reward=scores)
    for n in (2, 8):
        kl = toy.sequence_kl(toy.best_of_n_logprobs(untied, n), task.ref_logprobs)
        assert toy.best_of_n_kl_bound(n) - 0.01 < kl <= toy.best_of_n_kl_bound(n)


def test_token_logprobs_and_per_position_kl_chain_rule(task: toy.ToyTask) -> None:
    logp = toy.exact_optimal_policy(task, 0.2)
    tok = toy.token_logprobs(logp)
    assert torch.allclose(tok.sum(1), logp, atol=1e-9)
    assert torch.allclose(toy.token_logprobs(task.ref_logprobs), task.ref_token_logprobs, atol=1e-9)
    per_pos = toy.per_position_kl(task, logp)
    assert per_pos.shape == (toy.T,) and np.all(per_pos >= 0)
    assert per_pos.sum() == pytest.approx(toy.sequence_kl(logp, task.ref_logprobs), abs=1e-9)


# --- training -------------------------------------------------------------------------------


def test_trained_policy_reaches_the_exact_optimum(task: toy.ToyTask) -> None:
    beta = 0.5
    run = toy.train_policy(task, beta=beta, steps=150, batch_size=1024, seed=0)
    assert toy.sequence_kl(run.logprobs, toy.exact_optimal_policy(task, beta)) <= 0.05
    assert run.kl.shape == run.proxy.shape == run.gold.shape == run.kl_sampled.shape == (150,)
    assert run.beta.shape == (151,) and np.all(run.beta == beta)
    assert run.kl[0] == pytest.approx(0.0, abs=1e-12)  # step 0 samples from pi_ref
    assert abs(float(run.logprobs.exp().sum()) - 1.0) < 1e-9
    # The sampled KL the controller sees tracks the exact KL.
    assert abs(run.kl_sampled[-20:].mean() - run.kl[-20:].mean()) < 0.1


def test_training_is_deterministic(task: toy.ToyTask) -> None:
    a = toy.train_policy(task, beta=1.0, steps=20, batch_size=256, seed=7)
    b = toy.train_policy(task, beta=1.0, steps=20, batch_size=256, seed=7)
    c = toy.train_policy(task, beta=1.0, steps=20, batch_size=256, seed=8)
    assert torch.equal(a.logprobs, b.logprobs) and np.array_equal(a.kl, b.kl)
    assert not torch.equal(a.logprobs, c.logprobs)


def test_controller_sets_beta_each_step(task: toy.ToyTask) -> None:
    ctrl = AdaptiveKLController(init_kl_coef=0.05, target=0.5, horizon=2000)
    run = toy.train_policy(task, controller=ctrl, steps=30, batch_size=256)
    np.testing.assert_allclose(run.beta, ctrl.history.beta)
    np.testing.assert_allclose(run.kl_sampled, ctrl.history.kl)
    assert run.beta[-1] > run.beta[0]  # the KL overshot the small target, so beta rose


def test_train_policy_restores_thread_count(task: toy.ToyTask) -> None:
    before = torch.get_num_threads()
    toy.train_policy(task, beta=1.0, steps=2, batch_size=8)
    assert torch.get_num_threads() == before


# --- validation and command line ------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (lambda t: toy.make_task(n_pairs=0), ValueError, "n_pairs"),
        (lambda t: toy.make_task(seed=1.5), TypeError, "seed"),
        (lambda t: toy.make_task(bang_prob=1.0), ValueError, "bang_prob"),
        (lambda t: toy.make_task(label_flip=0.5), ValueError, "label_flip"),
        (lambda t: toy.train_policy(t), ValueError, "beta"),
        (lambda t: toy.train_policy(t, beta=0.1, controller=AdaptiveKLController()), ValueError, "beta"),
        (lambda t: toy.train_policy(t, beta=-1.0), ValueError, "beta"),
        (lambda t: toy.train_policy(t, controller="adaptive"), TypeError, "controller"),
        (lambda t: toy.train_policy(t, beta=1.0, batch_size=1), ValueError, "batch_size"),
        (lambda t: toy.train_policy(t, beta=1.0, steps=0), ValueError, "steps"),
        (lambda t: toy.train_policy("task", beta=1.0), TypeError, "task"),
        (lambda t: toy.exact_optimal_policy(t, 0.0), ValueError, "beta"),
        (lambda t: toy.exact_optimal_policy(t, 1.0, reward="human"), ValueError, "reward"),
        (lambda t: toy.best_of_n_logprobs(t, 0), ValueError, "n"),
        (lambda t: toy.sequence_kl(t.ref_logprobs[:5], t.ref_logprobs), ValueError, "logp"),
        (lambda t: toy.exact_frontier(t, [1.0, -1.0]), ValueError, "betas"),
        (lambda t: toy.ranking_agreement(t, 10, torch.Generator(), min_bangs=9), ValueError,
         "min_bangs"),
    ],
)
def test_bad_arguments_are_named(task: toy.ToyTask, call, exc, name: str) -> None:
    with pytest.raises(exc, match=name):
        call(task)


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    rows = toy.main(["--steps", "60", "--batch-size", "512", "--betas", "1.0"])
    assert len(rows) == 1 and rows[0]["beta"] == 1.0 and rows[0]["kl_to_opt"] < 0.1
    assert "KL(pi||pi*)" in capsys.readouterr().out
    for bad, name in ((["--betas", "-1"], "betas"), (["--steps", "0"], "steps"),
                      (["--n-pairs", "0"], "n_pairs"), (["--lr", "-0.1"], "lr")):
        with pytest.raises(SystemExit):
            toy.main(bad)
        assert name in capsys.readouterr().err
