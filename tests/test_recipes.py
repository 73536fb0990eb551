"""Tests of the recipes (kltutorial.toyrlhf.recipes) and of the per-token fixed points they stop at
(kltutorial.exact.fixed_points): every fixed point against the recipe's exact expected gradient, exact
gradient ascent that reaches it on a small space, the KL's importance weight in later epochs, bad input, and
short real runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kltutorial import exact as ex
from kltutorial import toyrlhf as toy
from kltutorial.estimators import kl_estimate
from kltutorial.exact.fixed_points import per_token_fixed_point
from kltutorial.toyrlhf import recipes as R
from kltutorial.toyrlhf.policy import TablePolicy, prefix_rows
from kltutorial.toyrlhf.recipes.common import Batch
from kltutorial.toyrlhf.recipes.grpo import group_advantages, grpo_loss
from kltutorial.toyrlhf.recipes.rloo import leave_one_out_advantages

REGULARISED = [name for name in R.RECIPES if R.get_recipe(name).fixed_point is not None]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def task(toy_task) -> toy.ToyTask:
    return toy_task


def _small(seed: int = 0, V: int = 3, T: int = 3):
    """A random reference table and scores on a space of V**T sequences."""
    gen = torch.Generator().manual_seed(seed)
    space = ex.SequenceSpace(vocab_size=V, length=T)
    ref = torch.log_softmax(torch.randn(space.n_prefixes, V, generator=gen, dtype=torch.float64), -1)
    scores = torch.randn(space.n_sequences, generator=gen, dtype=torch.float64)
    return space, ref, scores


# --- the registry --------------------------------------------------------------------------------


def test_the_recipes_of_the_book_are_registered_with_their_fixed_points() -> None:
    want = {
        "reinforce-k1-reward": "optimum", "ppo-k1-reward": "optimum", "rloo-k1-reward": "optimum",
        "ppo-k3-reward": None, "grpo-k3-loss": "forward", "grpo-k3ratio-loss": "reverse",
        "dr-grpo-k3-loss": "forward",
        "dr-grpo-k2-loss": "reverse", "dr-grpo-k3plus-loss": "reverse", "dr-grpo-k1-loss": None,
    }
    assert set(want) <= set(R.RECIPES)
    assert toy.RECIPES == R.RECIPES
    for name, fixed_point in want.items():
        assert R.get_recipe(name).fixed_point == fixed_point, name


# --- the per-token fixed points --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_fixed_point_satisfies_its_equation_at_every_prefix(seed: int) -> None:
    space, ref, scores = _small(seed)
    c = 0.7
    table = per_token_fixed_point(space, ref, scores, c, "forward")
    p = table.exp()
    assert torch.allclose(p.sum(-1), torch.ones(space.n_prefixes, dtype=torch.float64), atol=1e-14)
    # Q(h, b) by backward induction from the solved table, and the equation pi_b (Q_b - V) = c (pi_b - rho_b)
    V, o = space.vocab_size, space.offsets
    value = scores
    for L in reversed(range(space.length)):
        q = value.reshape(V**L, V)
        rows = p[o[L] : o[L + 1]]
        v = (rows * q).sum(-1, keepdim=True)
        lhs, rhs = rows * (q - v), c * (rows - ref[o[L] : o[L + 1]].exp())
        assert torch.allclose(lhs, rhs, atol=1e-12), L
        value = v.squeeze(-1)


def test_fixed_points_of_one_token_are_the_closed_forms() -> None:
    space = ex.SequenceSpace(vocab_size=2, length=1)
    ref = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    s = torch.tensor([0.0, 1.0], dtype=torch.float64)
    reverse = per_token_fixed_point(space, ref, s, 1.0, "reverse").exp()[0]
    assert torch.allclose(reverse, torch.softmax(s, 0))  # pi*_c on one token
    forward = per_token_fixed_point(space, ref, s, 1.0, "forward").exp()[0]
    assert float(forward[1]) == pytest.approx(2**-0.5, abs=1e-14)  # solves p(1 - p) = p - 1/2


@pytest.mark.parametrize("recipe", REGULARISED)
def test_expected_gradient_vanishes_at_each_fixed_point_and_not_at_the_reference(recipe: str, task) -> None:
    beta = 0.3
    table = R.fixed_point_table(task.space, task.ref_table, task.proxy_reward, recipe, beta)
    at_fp = R.expected_gradient(task.space, task.ref_table, task.proxy_reward, table, recipe, beta)
    at_ref = R.expected_gradient(task.space, task.ref_table, task.proxy_reward, task.ref_table, recipe, beta)
    assert at_fp.abs().max() < 1e-12
    assert at_ref.abs().max() > 1e-3


@pytest.mark.parametrize("recipe", ["rloo-k1-reward", "dr-grpo-k2-loss", "dr-grpo-k3-loss", "grpo-k3-loss",
                                    "grpo-k3ratio-loss"])
def test_exact_gradient_descent_reaches_the_fixed_point_on_a_small_space(recipe: str) -> None:
    space, ref, scores = _small(3, V=3, T=2)
    beta, group = 0.5, 4
    group_size = group if R.get_recipe(recipe).group_setting else None
    target = R.fixed_point_table(space, ref, scores, recipe, beta, group_size=group_size)
    logits = ref.clone()
    for _ in range(3000):
        logits -= 2.0 * R.expected_gradient(space, ref, scores, logits, recipe, beta, group_size=group_size)
    reached = ex.sequence_logprobs(space, torch.log_softmax(logits, -1))
    kl = ex.sequence_kl(reached, ex.sequence_logprobs(space, target))
    assert kl < 1e-10, kl


def test_group_mean_coefficient_is_beta_g_over_g_minus_one(task) -> None:
    fp = R.fixed_point_table(task.space, task.ref_table, task.proxy_reward, "dr-grpo-k2-loss", 0.3,
                             group_size=4)
    direct = per_token_fixed_point(task.space, task.ref_table, task.proxy_reward, 0.3 * 4 / 3, "reverse")
    assert torch.allclose(fp, direct)


def test_grpo_fixed_point_is_self_consistent(task) -> None:
    """The forward fixed point of GRPO's expected advantage g_pi, taken at that fixed point, is itself."""
    g, beta = 16, 0.3
    fp = R.fixed_point_table(task.space, task.ref_table, task.proxy_reward, "grpo-k3-loss", beta,
                             group_size=g)
    curve = R.group_advantage_curve(task.proxy_reward, ex.sequence_logprobs(task.space, fp), g)
    again = per_token_fixed_point(task.space, task.ref_table, curve, beta, "forward")
    assert torch.allclose(fp, again, atol=1e-10)


def test_group_advantage_curve_tends_to_the_standardised_score() -> None:
    """For a large group the std is the policy's own: g(x) -> (x - E s) / sigma (and (G - 1)/G of the
    centred score for the group mean alone)."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(50, generator=gen, dtype=torch.float64)
    logp = torch.log_softmax(torch.randn(50, generator=gen, dtype=torch.float64), 0)
    p = logp.exp()
    mean = (p * scores).sum()
    sigma = (p * (scores - mean) ** 2).sum().sqrt()
    curve = R.group_advantage_curve(scores, logp, 400, draws=400)
    assert torch.allclose(curve, (scores - mean) / sigma, atol=0.02)
    small = R.group_advantage_curve(scores, logp, 4)
    assert not torch.allclose(small, (scores - mean) / sigma, atol=0.05)


def test_k1_reward_fixed_point_is_the_optimum(task) -> None:
    logp = R.recipe_fixed_point(task, "ppo-k1-reward", 0.3)
    assert torch.allclose(logp, ex.optimal_policy(task.ref_logprobs, task.proxy_reward, 0.3))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"recipe": "ppo-k9-reward", "beta": 0.3}, "recipe must be one of"),
        ({"recipe": "dr-grpo-k3-loss", "beta": 0.0}, "beta"),
        ({"recipe": "dr-grpo-k3-loss", "beta": -1.0}, "beta"),
        ({"recipe": "dr-grpo-k3-loss", "beta": 0.3, "group_size": 1}, "group_size"),
        ({"recipe": "ppo-k1-reward", "beta": 0.3, "group_size": 4}, "group_size"),
        ({"recipe": "dr-grpo-k1-loss", "beta": 0.3}, "no stable fixed point"),
        ({"recipe": "ppo-k3-reward", "beta": 0.3}, "repels on both sides"),
    ],
)
def test_recipe_fixed_point_rejects_bad_input(kwargs, match, task) -> None:
    with pytest.raises(ValueError, match=match):
        R.recipe_fixed_point(task, **kwargs)


def test_kl_to_fixed_points_measures_a_policy_against_both_points(task) -> None:
    beta = 0.3
    optimum = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, beta)
    own_point = R.recipe_fixed_point(task, "dr-grpo-k3-loss", beta)
    # at the recipe's own point: 0 to it, and exactly its distance to pi*_beta
    to_own, to_opt = R.kl_to_fixed_points(task, "dr-grpo-k3-loss", own_point, beta)
    assert abs(to_own) < 1e-12 and to_opt == pytest.approx(float(ex.sequence_kl(own_point, optimum)))
    assert to_opt > 1e-3  # k3 in the loss stops off pi*_beta
    # k1 in the reward: its own point is pi*_beta, so the two distances agree
    to_own, to_opt = R.kl_to_fixed_points(task, "ppo-k1-reward", task.ref_logprobs, beta)
    assert to_own == pytest.approx(to_opt) and to_opt == pytest.approx(
        float(ex.sequence_kl(task.ref_logprobs, optimum)))
    # no stable fixed point: NaN for it, the distance to pi*_beta still measured
    to_own, to_opt = R.kl_to_fixed_points(task, "dr-grpo-k1-loss", optimum, beta)
    assert to_own != to_own and abs(to_opt) < 1e-12
    with pytest.raises(ValueError, match="beta"):
        R.kl_to_fixed_points(task, "ppo-k1-reward", optimum, 0.0)
    with pytest.raises(ValueError, match="recipe must be one of"):
        R.kl_to_fixed_points(task, "ppo-k9-reward", optimum, beta)


# --- the pieces of the updates ----------------------------------------------------------------------


def test_group_and_leave_one_out_advantages() -> None:
    s = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    plain = group_advantages(s, 3, scale_by_std=False, eps=0.0)
    assert torch.equal(plain, torch.tensor([-1.0, 0, 1, 0, 0, 0]))
    scaled = group_advantages(s, 3, scale_by_std=True, eps=1e-4)
    assert torch.allclose(scaled[:3], torch.tensor([-1.0, 0, 1]) / (1 + 1e-4))  # std of 1, 2, 3 is 1
    assert torch.equal(scaled[3:], torch.zeros(3))  # equal scores: no signal
    loo = leave_one_out_advantages(s, 3)
    assert torch.allclose(loo[:3], torch.tensor([-1.5, 0.0, 1.5]))


def test_prefix_rows_match_the_listed_prefix_ids(task) -> None:
    assert torch.equal(prefix_rows(task.space, task.space.sequences), task.space.prefix_ids)


def _batch_under(policy_table: torch.Tensor, old_table: torch.Tensor, ref_table: torch.Tensor, space):
    """Every sequence of a small space as one batch: old and reference log-probs, and the current ones."""
    rows, toks = space.prefix_ids, space.sequences
    batch = Batch(toks, old_table[rows, toks], ref_table[rows, toks], torch.zeros(space.n_sequences))
    return batch, torch.log_softmax(policy_table, -1)[rows, toks]


@pytest.mark.parametrize("weight", ["none", "ratio"])
def test_kl_weight_in_a_later_epoch(weight: str) -> None:
    """On samples of pi_old: "ratio" (not detached) gives the gradient of E_{pi_theta}[k3], the per-token
    reverse KL's, at every pi_theta; "none" gives, at pi_theta = pi_old, the forward KL's, pi - pi_ref."""
    space = ex.SequenceSpace(vocab_size=4, length=1)
    gen = torch.Generator().manual_seed(0)
    ref = torch.log_softmax(torch.randn(1, 4, generator=gen, dtype=torch.float64), -1)
    old = torch.log_softmax(torch.randn(1, 4, generator=gen, dtype=torch.float64), -1)
    settings = R.GRPOSettings(kl_weight=weight, clip=1e9)

    def sampled_gradient(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone().requires_grad_(True)
        batch, logp = _batch_under(logits, old, ref, space)
        _, info = grpo_loss(logp, batch, torch.zeros_like(logp), 1.0, settings)
        expected = (old.exp()[0] * info["penalty"][:, 0]).sum()  # the exact mean over pi_old's samples
        return torch.autograd.grad(expected, logits)[0]

    def reverse_gradient(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone().requires_grad_(True)
        current = torch.log_softmax(logits, -1)
        return torch.autograd.grad((current.exp() * kl_estimate(current, ref, "k3")).sum(), logits)[0]

    later = old + 0.3 * torch.randn(1, 4, generator=gen, dtype=torch.float64)  # a later epoch's policy
    if weight == "ratio":
        assert torch.allclose(sampled_gradient(later), reverse_gradient(later), atol=1e-12)
        assert torch.allclose(sampled_gradient(old), reverse_gradient(old), atol=1e-12)
    else:
        assert torch.allclose(sampled_gradient(old), old.exp() - ref.exp(), atol=1e-12)  # forward KL's
        assert not torch.allclose(sampled_gradient(later), reverse_gradient(later), atol=1e-3)
        assert not torch.allclose(sampled_gradient(later), later.softmax(-1) - ref.exp(), atol=1e-3)


# --- train_recipe ----------------------------------------------------------------------------------


def test_reinforce_recipe_is_todays_trainer_unchanged(task) -> None:
    config = toy.TrainConfig(beta=0.5, steps=20, batch_size=256)
    run = R.train_recipe(task, "reinforce-k1-reward", config, generator=torch.Generator().manual_seed(3))
    old = toy.train_policy(task, config, generator=torch.Generator().manual_seed(3))
    assert torch.equal(run.logprobs, old.logprobs)
    assert run.kl[0] == old.kl[0] and run.group_size is None


def test_rloo_lands_on_the_optimum(task) -> None:
    run = R.train_recipe(task, "rloo-k1-reward", toy.TrainConfig(beta=0.3),
                         generator=torch.Generator().manual_seed(0))
    kl = ex.sequence_kl(run.logprobs, R.recipe_fixed_point(task, "rloo-k1-reward", 0.3))
    assert kl <= 0.02, kl
    assert run.group_size == 4 and run.steps[-1] == 400
    assert run.kl[-1] == pytest.approx(ex.sequence_kl(run.logprobs, task.ref_logprobs))


@pytest.mark.parametrize(
    "recipe", ["dr-grpo-k3-loss", "grpo-k3-loss", "ppo-k1-reward", "dr-grpo-k3plus-loss"]
)
def test_a_short_run_moves_towards_its_fixed_point(recipe: str, task) -> None:
    config = toy.TrainConfig(beta=0.3, steps=40, batch_size=512)
    run = R.train_recipe(task, recipe, config, generator=torch.Generator().manual_seed(0))
    target = R.recipe_fixed_point(task, recipe, 0.3, group_size=run.group_size)
    before = ex.sequence_kl(task.ref_logprobs, target)
    assert ex.sequence_kl(run.logprobs, target) < 0.5 * before


def test_same_generator_same_run(task) -> None:
    config = toy.TrainConfig(beta=0.3, steps=5, batch_size=64)
    a = R.train_recipe(task, "ppo-k1-reward", config, generator=torch.Generator().manual_seed(1))
    b = R.train_recipe(task, "ppo-k1-reward", config, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.logprobs, b.logprobs)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda t: R.train_recipe(t, "grpo", toy.TrainConfig(beta=0.3), generator=torch.Generator()),
         ValueError, "recipe must be one of"),
        (lambda t: R.train_recipe(t, "dr-grpo-k3-loss", toy.TrainConfig(), generator=torch.Generator()),
         ValueError, "fixed beta"),
        (lambda t: R.train_recipe(t, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3, batch_size=100),
                                  generator=torch.Generator()), ValueError, "multiple of group_size"),
        (lambda t: R.train_recipe(t, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3), generator=0),
         TypeError, "generator"),
        (lambda t: R.train_recipe(t, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3),
                                  generator=torch.Generator(),
                                  policy="mlp"), ValueError, "policy"),
        (lambda t: R.train_recipe(t, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3),
                                  generator=torch.Generator(),
                                  settings=R.PPOSettings()), TypeError, "GRPOSettings"),
        (lambda t: R.train_recipe(t, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3),
                                  generator=torch.Generator(),
                                  settings=R.GRPOSettings(estimator="k2", scale_by_std=False)),
         ValueError, "estimator"),
        (lambda t: R.GRPOSettings(group_size=1), ValueError, "group_size"),
        (lambda t: R.RLOOSettings(group_size=1), ValueError, "group_size"),
        (lambda t: R.GRPOSettings(kl_weight="detached"), ValueError, "kl_weight"),
        (lambda t: R.PPOSettings(lam=1.5), ValueError, "lam"),
        (lambda t: toy.TrainConfig(beta=0.0), ValueError, "beta"),
    ],
)
def test_train_recipe_rejects_bad_input(call, error, match, task) -> None:
    with pytest.raises(error, match=match):
        call(task)


def test_settings_can_be_overridden(task) -> None:
    settings = dataclasses.replace(R.get_recipe("dr-grpo-k3-loss").settings, group_size=8)
    run = R.train_recipe(task, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3, steps=2, batch_size=64),
                         generator=torch.Generator().manual_seed(0), settings=settings)
    assert run.group_size == 8 and run.settings is settings


def test_table_policy_starts_at_the_reference(task) -> None:
    policy = TablePolicy(task)
    logp = policy(task.space.sequences[:10])
    assert torch.allclose(logp, task.ref_table[task.space.prefix_ids[:10]])


def test_benchmark_prints_steps_per_second_for_both_policies(capsys: pytest.CaptureFixture[str]) -> None:
    from kltutorial.toyrlhf import bench

    rows = bench.main(["--steps", "1", "--batch-size", "64", "--recipes", "dr-grpo-k2-loss"])
    assert [(r["recipe"], r["policy"]) for r in rows] == [
        ("reinforce-k1-reward", "table"), ("dr-grpo-k2-loss", "table"), ("dr-grpo-k2-loss", "transformer")]
    assert all(float(r["steps_per_s"]) > 0 for r in rows)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["recipe", "policy", "steps/s"] and out[1].rstrip().endswith("1.00x")


def test_a_prebuilt_network_is_the_reference_of_its_run(task) -> None:
    from kltutorial.toyrlhf.transformer import TransformerPolicy

    net = TransformerPolicy(task.space, width=16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        start = ex.sequence_logprobs(task.space, net.table())
    run = R.train_recipe(task, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3, steps=2, batch_size=64, lr=1e-3),
                         generator=torch.Generator().manual_seed(0), policy=net)
    assert torch.allclose(run.task.ref_logprobs, start)  # KL and fixed points are taken against it
    assert run.kl[0] == pytest.approx(0.0, abs=1e-12) and run.kl[-1] > 0
    with pytest.raises(TypeError, match="policy must be"):
        R.train_recipe(task, "dr-grpo-k3-loss", toy.TrainConfig(beta=0.3), generator=torch.Generator(),
                       policy=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="table policy only"):
        R.train_recipe(task, "reinforce-k1-reward", toy.TrainConfig(beta=0.3), generator=torch.Generator(),
                       policy=net)


def test_k3_in_the_reward_has_a_fixed_point_that_repels() -> None:
    """The registry's example (V = 2, T = 1, pi_ref = (0.5, 0.5), scores (1, 0), beta 0.3): PPO's expected
    gradient with k3 in the reward vanishes at pi = (0.079, 0.921), and a descent step on either side of
    that point moves the policy further away from it."""
    space = ex.SequenceSpace(vocab_size=2, length=1)
    ref = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    scores = torch.tensor([1.0, 0.0], dtype=torch.float64)

    def drift(p0: float) -> float:  # d logit(p0) / d step under gradient descent
        logits = torch.log(torch.tensor([[p0, 1 - p0]], dtype=torch.float64))
        g = R.expected_gradient(space, ref, scores, logits, "ppo-k3-reward", 0.3)
        return -float(g[0, 0] - g[0, 1])

    lo, hi = 0.02, 0.5
    assert drift(lo) < 0 < drift(hi)
    for _ in range(50):  # bisection on the drift's sign
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if drift(mid) < 0 else (lo, mid)
    assert abs(lo - 0.079) < 5e-4
    assert drift(lo - 0.01) < 0 < drift(hi + 0.01)  # pushed down below it, up above it
    assert R.get_recipe("ppo-k3-reward").stability == "repels"
    assert R.get_recipe("dr-grpo-k1-loss").stability == "none"
