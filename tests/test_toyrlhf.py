"""Tests of kltutorial.toyrlhf (book section 11): the configurations, the task and its proxy fit, the
task's exact quantities, the trainer against the exact optimum pi*_beta, and the command line."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kltutorial import AdaptiveKLController
from kltutorial import exact as ex
from kltutorial import toyrlhf as toy

ROOT = Path(__file__).resolve().parents[1]


def _task(n_pairs: int = 100, seed: int = 0, data_set: int = 0, **config: float) -> toy.ToyTask:
    """The task of book section 11: the data generator keyed by [seed, n_pairs, data set]."""
    return toy.make_task(toy.TaskConfig(n_pairs=n_pairs, **config), rng=np.random.default_rng(seed),
                         data_rng=np.random.default_rng([seed, n_pairs, data_set]))


def _index(sequence: str) -> int:
    """Row of a sequence such as "ab!c!" in task.space.sequences (the string read in base 8)."""
    return int(np.ravel_multi_index([toy.VOCAB.index(c) for c in sequence], (8,) * toy.LENGTH))


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def task() -> toy.ToyTask:
    return _task()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The trainer's tensors are tiny: on a shared 2-core machine one thread is many times faster (the
    library never sets it). Set for this module's tests only and restored after them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the configurations ---------------------------------------------------------------------


def test_configs_are_frozen_values_with_the_documented_defaults() -> None:
    task_config, train_config = toy.TaskConfig(), toy.TrainConfig(beta=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task_config.n_pairs = 10  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        train_config.beta = 1.0  # type: ignore[misc]
    assert dataclasses.astuple(task_config) == (100, 0.08, 1.0, 0.5, 3.0, 1.5, 0.5, 2.0, 0.0, 10.0)
    assert dataclasses.astuple(train_config) == (0.5, 400, 2048, 0.1, 0.2)
    assert toy.TrainConfig().beta is None  # a controller will set it
    assert toy.TaskConfig(n_pairs=30) == toy.TaskConfig(n_pairs=30) != toy.TaskConfig(n_pairs=31)
    assert len({toy.TrainConfig(beta=1.0), toy.TrainConfig(beta=1.0)}) == 1  # hashable, by value
    assert dataclasses.replace(train_config, steps=10).steps == 10


@pytest.mark.parametrize(
    ("make", "exc", "message"),
    [
        (lambda: toy.TaskConfig(n_pairs=0), ValueError, "TaskConfig.n_pairs must be an int >= 1, got 0"),
        (lambda: toy.TaskConfig(n_pairs=10.0), TypeError, "TaskConfig.n_pairs must be an int, got float"),
        (lambda: toy.TaskConfig(n_pairs=True), TypeError, "TaskConfig.n_pairs must be an int, got bool"),
        (lambda: toy.TaskConfig(bang_prob=1.0), ValueError, r"TaskConfig.bang_prob must lie in \(0, 1\)"),
        (lambda: toy.TaskConfig(bang_prob=0), ValueError, "bang_prob"),
        (lambda: toy.TaskConfig(dirichlet_alpha=-1.0), ValueError, "dirichlet_alpha must be a finite num"),
        (lambda: toy.TaskConfig(bang_penalty=-1.5), ValueError, "bang_penalty must be a finite number >= 0"),
        (lambda: toy.TaskConfig(repeat_penalty=math.inf), ValueError, "0 switches this term off"),
        (lambda: toy.TaskConfig(label_temperature=0.0), ValueError, "label_temperature"),
        (lambda: toy.TaskConfig(label_flip=0.5), ValueError, r"label_flip must lie in \[0, 0.5\)"),
        (lambda: toy.TaskConfig(prior_precision=math.nan), ValueError, "prior_precision"),
        (lambda: toy.TaskConfig(bang_bonus="3"), TypeError, "bang_bonus must be a real number, got str"),
        (lambda: toy.TrainConfig(beta=-1.0), ValueError, "TrainConfig.beta must be a finite number > 0"),
        (lambda: toy.TrainConfig(beta=0.0), ValueError, "leave it None only when a controller sets beta"),
        (lambda: toy.TrainConfig(steps=0), ValueError, "TrainConfig.steps must be an int >= 1, got 0"),
        (lambda: toy.TrainConfig(steps=1.5), TypeError, "TrainConfig.steps must be an int"),
        (lambda: toy.TrainConfig(batch_size=1), ValueError, "leave-one-out baseline"),
        (lambda: toy.TrainConfig(lr=-0.1), ValueError, "TrainConfig.lr must be a finite number > 0"),
        (lambda: toy.TrainConfig(critic_min_step=1.5), ValueError, r"critic_min_step must lie in \(0, 1\]"),
    ],
)
def test_config_validation_names_the_field_and_the_fix(make, exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=message):
        make()


# --- the task -------------------------------------------------------------------------------


def test_task_enumerates_every_sequence_once(task: toy.ToyTask) -> None:
    assert task.space == ex.SequenceSpace(8, 5) and task.space.n_sequences == 32768
    assert task.space.sequences.shape == (32768, toy.LENGTH)
    for name in ("ref_logprobs", "gold_reward", "proxy_reward", "bang_count"):
        assert getattr(task, name).shape == (32768,)
    assert task.ref_table.shape == (4681, 8) and task.ref_token_logprobs.shape == (32768, 5)
    assert abs(float(task.ref_logprobs.exp().sum()) - 1.0) < 1e-12
    assert task.config == toy.TaskConfig() and task.pairs.shape == (100, 2)


def test_reference_is_the_markov_chain(task: toy.ToyTask) -> None:
    assert torch.allclose(task.ref_transition.sum(1), torch.ones(8, dtype=torch.float64))
    assert float(task.ref_initial[toy.BANG]) == pytest.approx(0.08)
    assert torch.allclose(task.ref_transition[:, toy.BANG], torch.full((8,), 0.08, dtype=torch.float64))
    rng = np.random.default_rng(1)
    for i in rng.integers(0, task.space.n_sequences, size=20):
        y = task.space.sequences[i]
        logp = task.ref_initial[y[0]].log() + sum(
            task.ref_transition[y[t - 1], y[t]].log() for t in range(1, toy.LENGTH)
        )
        assert abs(float(logp - task.ref_logprobs[i])) < 1e-12
    # The table is the chain: the next-token table of the distribution over sequences is ref_table.
    back = ex.next_token_logprobs(task.space, task.ref_logprobs)
    torch.testing.assert_close(back, task.ref_table, rtol=0, atol=1e-10)


def test_bang_is_rare_and_gold_saturates(task: toy.ToyTask) -> None:
    dist = toy.bang_count_distribution(task, task.ref_logprobs)
    assert dist.shape == (toy.LENGTH + 1,) and dist.sum() == pytest.approx(1.0, abs=1e-12)
    # P(no "!") = P(first is not "!") P(not "!" after anything)^4 = 0.92**5, the chain's own numbers.
    assert dist[0] == pytest.approx(0.92**5, abs=1e-12)
    assert 0.02 < dist[2:].sum() < 0.1  # "a few percent" of the reference mass
    # Gold reward differences in closed form (none of these sequences has a repeated neighbour).
    idx = {s: _index(s) for s in ("abcde", "abcd!", "ab!c!")}
    g, w = task.gold_reward, task.gold_token_weights
    # "e" -> "!": lose w_e, gain the bonus 3; "d" -> a second "!": lose w_d, pay the penalty 1.5.
    assert float(g[idx["abcd!"]] - g[idx["abcde"]]) == pytest.approx(3.0 - float(w[4]), abs=1e-12)
    assert float(g[idx["ab!c!"]] - g[idx["abcd!"]]) == pytest.approx(-1.5 - float(w[3]), abs=1e-12)
    assert task.decode(idx["ab!c!"]) == "ab!c!"


def test_proxy_fits_its_pairs_and_fails_where_data_is_thin(task: toy.ToyTask) -> None:
    a, b = task.pairs[:, 0], task.pairs[:, 1]
    predicted = task.proxy_reward[a] > task.proxy_reward[b]
    accuracy = float((predicted == task.pair_labels).double().mean())
    assert accuracy > 0.6  # better than chance on its own (noisy) training labels
    torch.testing.assert_close(task.proxy_reward, task.features @ task.proxy_weights)
    gen = _gen(0)
    overall = toy.ranking_agreement(task, 20_000, gen)
    thin = toy.ranking_agreement(task, 20_000, gen, min_bangs=2)
    assert overall > 0.7 and thin < overall - 0.05
    # With few pairs the proxy extrapolates: each "!" beats every other token, on top of "has a !".
    assert task.proxy_weights[toy.BANG] > task.proxy_weights[: toy.BANG].max()
    assert task.proxy_weights[toy.HAS_BANG] > 0


def test_proxy_is_the_map_estimate(task: toy.ToyTask) -> None:
    """At the fitted weights the gradient of the penalised log-likelihood is zero."""
    a, b = task.pairs[:, 0], task.pairs[:, 1]
    w = task.proxy_weights.clone().requires_grad_(True)
    diff = task.features[a] - task.features[b]
    nll = torch.nn.functional.binary_cross_entropy_with_logits(diff @ w, task.pair_labels.double())
    loss = nll + 0.5 * task.config.prior_precision * (w**2).sum() / len(a)
    (grad,) = torch.autograd.grad(loss, w)
    assert float(grad.abs().max()) < 1e-6


def test_the_generators_decide_the_task() -> None:
    t1, t2 = _task(50, seed=3), _task(50, seed=3)
    assert torch.equal(t1.proxy_reward, t2.proxy_reward)
    t3 = _task(50, seed=3, data_set=1)  # another data generator: same chain and gold, other data
    assert torch.equal(t1.ref_logprobs, t3.ref_logprobs) and torch.equal(t1.gold_reward, t3.gold_reward)
    assert not torch.equal(t1.proxy_reward, t3.proxy_reward)
    t4 = _task(50, seed=4)  # another chain
    assert not torch.equal(t1.ref_logprobs, t4.ref_logprobs)


def test_config_fields_reach_the_task() -> None:
    no_repeat = _task(30, repeat_penalty=0.0, bang_prob=0.2)
    assert float(no_repeat.ref_initial[toy.BANG]) == pytest.approx(0.2)
    aa, ab = _index("aabcd"), _index("abcad")
    # Same token counts, one repeated pair: the gold rewards differ by the repeat penalty (0 here, else 0.5).
    assert float(no_repeat.gold_reward[aa] - no_repeat.gold_reward[ab]) == pytest.approx(0.0, abs=1e-12)
    default = _task(30)
    assert float(default.gold_reward[aa] - default.gold_reward[ab]) == pytest.approx(-0.5, abs=1e-12)


# --- the task's exact quantities ------------------------------------------------------------


def test_optimum_of_the_task_closed_form(task: toy.ToyTask) -> None:
    for beta in (0.1, 0.5, 2.0):
        logp = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, beta)
        kl = ex.sequence_kl(logp, task.ref_logprobs)
        reward = ex.expected_reward(logp, task.proxy_reward)
        log_z = float(torch.logsumexp(task.ref_logprobs + task.proxy_reward / beta, 0))
        assert kl == pytest.approx(reward / beta - log_z, abs=1e-9)  # KL(pi* || pi_ref) = E*[r]/beta - log Z
        j_opt = reward - beta * kl
        for other in (task.ref_logprobs, ex.optimal_policy(task.ref_logprobs, task.proxy_reward, 2 * beta)):
            j = ex.expected_reward(other, task.proxy_reward)
            assert j - beta * ex.sequence_kl(other, task.ref_logprobs) < j_opt


def test_frontier_of_the_task(task: toy.ToyTask) -> None:
    betas = [2.0, 1.0, 0.5, 0.2, 0.1]
    f = toy.exact_frontier(task, betas)
    assert np.all(np.diff(f.kl) > 0) and np.all(np.diff(f.proxy) > 0) and f.reward == "proxy"
    opt = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, 0.2)
    assert f.gold[3] == pytest.approx(ex.expected_reward(opt, task.gold_reward), abs=1e-12)
    assert f.multi_bang[3] == pytest.approx(toy.bang_count_distribution(task, opt)[2:].sum(), abs=1e-12)
    gold = toy.exact_frontier(task, betas, reward="gold")  # optimising the gold reward itself
    assert np.all(np.diff(gold.gold) > 0) and np.all(gold.gold > f.gold)


@pytest.mark.parametrize("n", [1, 16, 4096])
def test_best_of_n_on_the_tied_proxy(task: toy.ToyTask, n: int) -> None:
    """The proxy is linear in token counts, so many sequences tie: the exact KL stays below the formula,
    and far below it once n is large enough for the best reward value to be drawn more than once."""
    assert torch.unique(task.proxy_reward).shape[0] < task.space.n_sequences / 10
    logp = ex.best_of_n_logprobs(task.ref_logprobs, task.proxy_reward, n)
    kl = ex.sequence_kl(logp, task.ref_logprobs)
    assert kl <= ex.best_of_n_kl_bound(n) + 1e-9
    if n == 4096:
        assert kl < ex.best_of_n_kl_bound(n) - 0.05


def test_per_position_kl_of_the_optimum(task: toy.ToyTask) -> None:
    logp = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, 0.2)
    table = ex.next_token_logprobs(task.space, logp)
    per_pos = ex.per_position_kl(task.space, table, task.ref_table)
    assert per_pos.shape == (toy.LENGTH,) and torch.all(per_pos > 0)
    assert float(per_pos.sum()) == pytest.approx(ex.sequence_kl(logp, task.ref_logprobs), abs=1e-9)


# --- training -------------------------------------------------------------------------------


def test_trained_policy_reaches_the_exact_optimum(task: toy.ToyTask) -> None:
    beta = 0.5
    run = toy.train_policy(task, toy.TrainConfig(beta=beta, steps=150, batch_size=1024), generator=_gen())
    optimum = ex.optimal_policy(task.ref_logprobs, task.proxy_reward, beta)
    assert ex.sequence_kl(run.logprobs, optimum) <= 0.05
    assert ex.sequence_kl(run.logprobs, optimum) < 0.1 * ex.sequence_kl(task.ref_logprobs, optimum)
    assert run.kl.shape == run.proxy.shape == run.gold.shape == run.kl_sampled.shape == (150,)
    assert run.beta.shape == (151,) and np.all(run.beta == beta)
    assert run.kl[0] == pytest.approx(0.0, abs=1e-12)  # step 0 samples from pi_ref
    assert run.proxy[0] == pytest.approx(ex.expected_reward(task.ref_logprobs, task.proxy_reward), abs=1e-12)
    assert abs(float(run.logprobs.exp().sum()) - 1.0) < 1e-9
    # The sampled KL the controller sees tracks the exact KL.
    assert abs(run.kl_sampled[-20:].mean() - run.kl[-20:].mean()) < 0.1


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().view(torch.int64)  # float64 as its bits: -0.0 differs from 0.0


@pytest.mark.parametrize("batch", [1, 7, 2048])
def test_visited_rows_give_the_whole_table_s_numbers_and_gradient_bit_for_bit(
        task: toy.ToyTask, batch: int) -> None:
    """Normalising only the visited rows (TablePolicy.forward) changes no bit of the
    log-probs nor of theta's gradient, rows visited many times included. (This runs on this machine's
    kernels; nbval's second pass re-runs every training notebook on the second kernel set.)"""
    from kltutorial.toyrlhf.policy import TablePolicy, visited_logprobs

    gen = _gen(batch)
    P, V = task.ref_table.shape
    theta = (0.5 * torch.randn(P, V, dtype=torch.float64, generator=gen)).requires_grad_()
    idx = ex.sample_autoregressive(task.space, task.ref_table, batch, gen)
    rows, tokens = task.space.prefix_ids[idx], task.space.sequences[idx]
    weight = torch.randn(batch, task.space.length, dtype=torch.float64, generator=gen)
    whole = torch.log_softmax(task.ref_table + theta, dim=-1)[rows, tokens]  # the whole-table way
    (whole * weight).sum().backward()
    grad_whole, theta.grad = theta.grad.clone(), None
    part = visited_logprobs(task.ref_table, theta, rows).gather(-1, tokens[..., None]).squeeze(-1)
    (part * weight).sum().backward()
    assert torch.equal(_bits(part), _bits(whole))
    assert torch.equal(_bits(theta.grad), _bits(grad_whole))
    assert (grad_whole.abs().sum(-1) > 0).sum() < P  # some rows unvisited: their gradient is 0 either way

    policy = TablePolicy(task)
    with torch.no_grad():
        policy.theta.copy_(theta)
    assert torch.equal(_bits(policy(task.space.sequences[idx])), _bits(policy.table()[rows]))


def test_training_depends_only_on_the_generator(task: toy.ToyTask) -> None:
    config = toy.TrainConfig(beta=1.0, steps=20, batch_size=256)
    a = toy.train_policy(task, config, generator=_gen(7))
    torch.manual_seed(999)  # the global generator plays no part
    b = toy.train_policy(task, config, generator=_gen(7))
    c = toy.train_policy(task, config, generator=_gen(8))
    assert torch.equal(a.logprobs, b.logprobs) and np.array_equal(a.kl, b.kl)
    assert not torch.equal(a.logprobs, c.logprobs)
    g = _gen(7)
    before = g.get_state()
    toy.train_policy(task, dataclasses.replace(config, steps=2), generator=g)
    assert not torch.equal(g.get_state(), before)  # it drew its batches from the caller's generator


def test_controller_sets_beta_each_step(task: toy.ToyTask) -> None:
    ctrl = AdaptiveKLController(beta=0.05, target_kl=0.5, horizon=2000)
    run = toy.train_policy(task, toy.TrainConfig(steps=30, batch_size=256), controller=ctrl, generator=_gen())
    np.testing.assert_allclose(run.beta, ctrl.history.beta)
    np.testing.assert_allclose(run.kl_sampled, ctrl.history.kl)
    assert run.beta[-1] > run.beta[0]  # the KL overshot the small target, so beta rose


def test_training_leaves_process_settings_alone(task: toy.ToyTask, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("train_policy must not change process-wide settings")

    monkeypatch.setattr(torch, "set_num_threads", refuse)
    monkeypatch.setattr(torch, "manual_seed", refuse)
    before = torch.get_num_threads()
    toy.train_policy(task, toy.TrainConfig(beta=1.0, steps=2, batch_size=8), generator=_gen())
    assert torch.get_num_threads() == before


# --- bad arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda t: toy.make_task({"n_pairs": 10}, np.random.default_rng(), np.random.default_rng()),
         TypeError, "config must be a TaskConfig"),
        (lambda t: toy.make_task(toy.TaskConfig(), 0, np.random.default_rng()), TypeError,
         "rng must be a numpy.random.Generator"),
        (lambda t: toy.make_task(toy.TaskConfig(), np.random.default_rng(), None), TypeError, "data_rng"),
        (lambda t: toy.train_policy(t, toy.TrainConfig(), generator=_gen()), ValueError, "not neither"),
        (lambda t: toy.train_policy(t, toy.TrainConfig(beta=0.1), controller=AdaptiveKLController(),
                                    generator=_gen()), ValueError, "not both"),
        (lambda t: toy.train_policy(t, toy.TrainConfig(), controller="adaptive", generator=_gen()), TypeError,
         "controller must be a KLController"),
        (lambda t: toy.train_policy(t, {"beta": 1.0}, generator=_gen()), TypeError,
         "config must be a TrainConfig"),
        (lambda t: toy.train_policy(t, toy.TrainConfig(beta=1.0), generator=0), TypeError,
         "generator must be a torch.Generator"),
        (lambda t: toy.train_policy("task", toy.TrainConfig(beta=1.0), generator=_gen()), TypeError,
         "task must be a ToyTask"),
        (lambda t: toy.exact_frontier(t, [1.0, -1.0]), ValueError, "betas"),
        (lambda t: toy.exact_frontier(t, [1.0], reward="human"), ValueError, "reward must be one of"),
        (lambda t: toy.bang_count_distribution(t, t.ref_logprobs[:5]), ValueError,
         "logprobs must be a tensor of shape"),
        (lambda t: toy.ranking_agreement(t, 10, _gen(), min_bangs=9), ValueError, "min_bangs"),
        (lambda t: toy.ranking_agreement(t, 0, _gen()), ValueError, "n must be >= 1"),
    ],
)
def test_bad_arguments_are_named(task: toy.ToyTask, call, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call(task)


# --- command line ---------------------------------------------------------------------------


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    rows = toy.main(["--steps", "60", "--batch-size", "512", "--betas", "1.0"])
    assert len(rows) == 1 and rows[0]["beta"] == 1.0 and rows[0]["kl_to_opt"] < 0.1
    assert rows[0]["opt_kl"] == pytest.approx(toy.exact_frontier(_task(), [1.0]).kl[0], abs=1e-12)
    assert "KL(pi||pi*)" in capsys.readouterr().out
    assert torch.get_num_threads() == threads  # only `python -m` sets the thread count, for itself


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--betas", "1", "-1"], "TrainConfig.beta must be a finite number > 0, got -1.0"),
        (["--steps", "0"], "TrainConfig.steps must be an int >= 1, got 0"),
        (["--batch-size", "1"], "TrainConfig.batch_size must be an int >= 2"),
        (["--n-pairs", "0"], "TaskConfig.n_pairs must be an int >= 1, got 0"),
        (["--lr", "-0.1"], "TrainConfig.lr must be a finite number > 0"),
        (["--seed", "-1"], "--seed must be >= 0"),
    ],
)
def test_command_line_reports_bad_values_as_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        toy.main(argv)
    assert exit_info.value.code == 2  # argparse's usage error
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m kltutorial.toyrlhf") and f"error: {message}" in err


def test_command_line_trains_a_recipe_against_its_own_fixed_point(capsys: pytest.CaptureFixture[str]) -> None:
    rows = toy.main(["--recipe", "dr-grpo-k2-loss", "--steps", "40", "--batch-size", "512", "--betas", "0.3"])
    fixed = toy.recipe_fixed_point(_task(), "dr-grpo-k2-loss", 0.3)
    start = ex.sequence_kl(_task().ref_logprobs, fixed)
    assert rows[0]["recipe"] == "dr-grpo-k2-loss" and rows[0]["kl_to_fixed"] < 0.5 * start
    out = capsys.readouterr().out
    assert "recipe dr-grpo-k2-loss" in out and "KL(pi||fixed)" in out
    rows = toy.main(["--recipe", "dr-grpo-k1-loss", "--steps", "2", "--batch-size", "64", "--betas", "0.3"])
    assert math.isnan(rows[0]["kl_to_fixed"])  # no fixed point at all: printed as "none"
    assert capsys.readouterr().out.splitlines()[-1].split()[-1] == "none"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--recipe", "ppo"], "argument --recipe: invalid choice: 'ppo'"),
        (["--recipe", "grpo-k3-loss", "--batch-size", "100", "--steps", "1"],
         "TrainConfig.batch_size (100) must be a multiple of group_size (16)"),
    ],
)
def test_command_line_reports_a_bad_recipe_as_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        toy.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_python_dash_m_runs_the_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "kltutorial.toyrlhf", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "--betas" in done.stdout and done.stderr == ""


# --- the result objects in the figures of section 11 -------------------------------------------


def test_section_11_figures_read_the_real_results(task: toy.ToyTask) -> None:
    """The figures' own tests (tests/test_plotting_experiment.py) use stand-ins; this checks that the
    real ToyFrontier and TrainResult carry the attributes the figures read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kltutorial import plotting

    front = toy.exact_frontier(task, [2.0, 1.0, 0.5])
    axes = plotting.plot_toy_frontier(front)
    np.testing.assert_allclose(axes[0].lines[0].get_xdata(), front.kl)
    np.testing.assert_allclose(axes[1].lines[0].get_ydata(), front.gold)
    run = toy.train_policy(task, toy.TrainConfig(beta=1.0, steps=3, batch_size=8), generator=_gen())
    grid = plotting.plot_toy_controllers({"fixed": run}, target_kl=1.0)
    drawn = [line.get_ydata() for line in grid[0, 0].lines]
    assert any(len(y) == len(run.kl) and np.allclose(y, run.kl) for y in drawn)
    np.testing.assert_allclose(run.penalized_proxy, run.proxy - 1.0 * run.kl)
    plt.close("all")


def test_the_fixed_beta_sweep_is_one_constant(capsys):
    """The CLI's default sweep is toy.FIXED_BETAS, the sweep sections 1 and 11 run."""
    assert toy.FIXED_BETAS == tuple(sorted(toy.FIXED_BETAS, reverse=True))
    assert all(b > 0 for b in toy.FIXED_BETAS) and len(set(toy.FIXED_BETAS)) == len(toy.FIXED_BETAS)
    with pytest.raises(SystemExit):
        toy.main(["--help"])
    assert "default: the book's sweep, 1 0.5 0.3 0.2 0.15 0.1)" in " ".join(capsys.readouterr().out.split())


def test_command_line_trains_the_transformer_against_its_own_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = toy.main(["--recipe", "dr-grpo-k3-loss", "--policy", "transformer", "--steps", "2", "--batch-size",
                     "64", "--betas", "0.3", "--distill-steps", "10"])
    row = rows[0]
    assert row["kl"] > 0 and row["kl_to_fixed"] > 0 and 0 <= row["floor"] < row["kl_to_fixed"]
    out = capsys.readouterr().out
    assert "transformer policy" in out and "floor" in out
    with pytest.raises(SystemExit):
        toy.main(["--recipe", "reinforce-k1-reward", "--policy", "transformer", "--steps", "1"])
    with pytest.raises(SystemExit):
        toy.main(["--distill-steps", "0"])
    assert "--distill-steps must be >= 1, got 0" in capsys.readouterr().err
