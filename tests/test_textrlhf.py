"""Tests of kltutorial.textrlhf (the real-text chapter): the corpus and its split, the word-level tokenizer's
round trip, the stored model loaded offline, the gold reward, sampling with the KV cache, token_kl against
a direct computation from both models' logits, the metrics, the configs' checks, tiny end-to-end runs
of train_text that collapse without the penalty and not with it, the learned proxy reward (its labels,
its training, the stored model and its recorded accuracies) and the stored runs of the book."""

from __future__ import annotations

import copy
import pathlib
import re
import socket

import numpy as np
import pytest
import torch
import transformers

from kltutorial import textrlhf as text
from kltutorial.textrlhf import corpus as corpus_module
from kltutorial.textrlhf import trainer as trainer_module
from kltutorial.textrlhf.generation import draw, response_logits
from kltutorial.textrlhf.tokenizer import (
    PUNCTUATION,
    SPECIAL_TOKENS,
    build_tokenizer,
    build_vocabulary,
    words,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def corpus() -> text.Corpus:
    return text.load_corpus()


@pytest.fixture(scope="module")
def pretrained():
    return text.load_pretrained()


def _perturbed(model, seed: int = 0, scale: float = 0.02):
    """A copy of ``model``, every weight moved by ``scale`` x N(0, 1): a policy away from the reference."""
    policy = copy.deepcopy(model)
    g = _gen(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return policy


# --- the corpus ------------------------------------------------------------------------------------------


def test_the_corpus_is_cleaned_filtered_and_split_once_and_for_all(corpus: text.Corpus) -> None:
    assert 10_000 < len(corpus.train) < 14_000 and 1_000 < len(corpus.validation) < 1_600
    assert 0.08 < len(corpus.validation) / (len(corpus.train) + len(corpus.validation)) < 0.12
    assert set(corpus.dropped) == set(corpus_module.FILTERS) and all(corpus.dropped.values())
    assert not any(re.search(r"-o$|limerick|zippy", f) for f in corpus.files)
    everything = corpus.train + corpus.validation
    keys = [" ".join(re.findall(r"[a-z]+", q.lower())) for q in everything]
    assert len(set(keys)) == len(keys), "a duplicate survived"
    for q in everything:
        assert 20 <= len(q) <= 240 and q.isascii() and re.fullmatch(r"[A-Za-z .,!?;:'\"()`-]+", q), q
        assert q == " ".join(q.split()), q
    assert all(corpus_module.is_validation(q) for q in corpus.validation)
    assert not any(corpus_module.is_validation(q) for q in corpus.train)
    assert text.load_corpus() is corpus  # cached


def test_no_quote_holds_an_off_colour_word(corpus: text.Corpus) -> None:
    lowered = [q.lower() for q in corpus.train + corpus.validation]
    assert not any(corpus_module.OFF_COLOUR.search(q) for q in lowered)
    assert "ass" in corpus_module.BLOCKLIST  # decoded from the source's rot13
    assert corpus_module.OFF_COLOUR.search("what an ass.") and corpus_module.OFF_COLOUR.search("women are")
    assert any(re.search(r"\bassist", q) for q in lowered)  # a whole word does not drop the words it starts
    assert corpus.dropped["off-colour"] > 100


@pytest.mark.parametrize("entry, quote", [
    ("Many hands make light work.\n\t\t-- John Heywood\n", "Many hands make light work."),
    ("Two\n  lines.\n\t-- A. N. Other,\n\t\tin a book\n", "Two lines."),
    ("History is a race between education and catastrophe. -H. G. Wells", "History is a race between "
     "education and catastrophe."),
    ("Love -- the last of the serious diseases of childhood.", "Love -- the last of the serious diseases "
     "of childhood."),
])
def test_clean_entry_drops_the_attribution_only(entry: str, quote: str) -> None:
    assert corpus_module.clean_entry(entry) == quote


# --- the tokenizer ---------------------------------------------------------------------------------------


def test_the_tokenizer_round_trip_is_the_canonical_text(corpus: text.Corpus, pretrained) -> None:
    _, tok = pretrained
    for quote in corpus.validation:
        ids = tok(quote, add_special_tokens=False).input_ids
        canonical = tok.decode(ids)
        assert tok(canonical, add_special_tokens=False).input_ids == ids  # decode is encode's inverse
        if tok.unk_token_id not in ids:
            assert canonical.split() == _canonical(quote).split(), quote
    ids = tok("Don't panic -- it's only half-time, Zaphod!").input_ids
    assert tok.convert_ids_to_tokens(ids) == ["don't", "panic", "it's", "only", "half", "time", "##,",
                                              "<unk>", "##!"]
    assert tok.decode(ids) == "don't panic it's only half time, <unk>!"
    assert tok.decode(ids, skip_special_tokens=True) == "don't panic it's only half time,!"


def _canonical(quote: str) -> str:
    """The canonical form written out in plain Python: lower case, words and attached marks."""
    s = re.sub(r"[^a-z0-9'.,!?;:]+", " ", quote.lower())
    s = re.sub(r"(?<![a-z0-9])'|'(?![a-z])", " ", s)
    s = re.sub(r"\s*([.,!?;:])", r" \1 ", s)
    s = re.sub(r"\s+([.,!?;:])", r"\1", s)  # a mark attached to the word or mark before, a space after
    return " ".join(s.split())


def test_the_vocabulary_is_the_specials_the_marks_then_words_by_count(corpus, pretrained) -> None:
    _, tok = pretrained
    vocab = build_vocabulary(corpus.train)
    assert tok.convert_ids_to_tokens(list(range(len(tok)))) == list(vocab)
    assert vocab[:4] == SPECIAL_TOKENS and vocab[4:10] == tuple(f"##{m}" for m in PUNCTUATION)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert vocab[10:13] == ("the", "a", "of") or vocab[10] == "the"
    assert build_vocabulary(["b a, b."], size=1)[-1] == "b"
    assert words("It's (really) 'fine'; OK?") == ["it's", "really", "fine", "##;", "ok", "##?"]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="size"):
            build_vocabulary(["a"], size=bad)
    with pytest.raises(ValueError, match="start with"):
        build_tokenizer(["a", "b"])


# --- the stored model ------------------------------------------------------------------------------------


def test_the_stored_model_loads_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("load_pretrained tried to open a connection")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    model, tok = text.load_pretrained()
    assert isinstance(model, transformers.LlamaForCausalLM)
    assert isinstance(tok, transformers.PreTrainedTokenizerFast)
    assert model.dtype == torch.float32 and not model.training
    assert model.config.vocab_size == len(tok) and model.config.tie_word_embeddings
    n = sum(p.numel() for p in model.parameters())
    weights = text.PRETRAINED_DIR / "model.safetensors"
    assert weights.stat().st_size < 10 * 2**20 and 2 * n <= weights.stat().st_size < 2 * n + 2**16  # float16
    meta = text.pretrained_metadata()
    assert meta["command"].startswith("python -m kltutorial.textrlhf pretrain")
    assert {"machine", "date", "validation_perplexity", "corpus", "reference_samples"} <= set(meta)
    assert meta["parameters"] == n
    with pytest.raises(FileNotFoundError, match="pretrain"):
        text.load_pretrained(text.PRETRAINED_DIR / "missing")


def test_the_stored_model_has_the_recorded_perplexity_and_writes_corpus_words(corpus, pretrained) -> None:
    """The numbers pretrain.json records, measured again: the perplexity on the first 300 validation quotes
    (the whole set is recorded), and what a small sample's words are."""
    model, tok = pretrained
    meta = text.pretrained_metadata()
    assert text.perplexity(model, tok, corpus.validation) == pytest.approx(meta["validation_perplexity"],
                                                                           abs=1e-3)
    assert meta["reference_samples"]["corpus_word_share"] >= 0.85
    assert meta["reference_samples"]["distinct_2"] >= 0.8
    _, texts = text.evaluate_policy(model, model, tok, n=64, generator=_gen(1))
    known = text.corpus_ngrams(corpus.train + corpus.validation, 1)
    assert text.corpus_share(texts, known, 1) >= 0.85 and text.distinct_n(texts, 2) >= 0.8


# --- the reward and the metrics --------------------------------------------------------------------------


def test_the_gold_reward_is_vaders_compound_score() -> None:
    r = text.gold_reward(["many hands make light work.", "i love it!", "i hate it.", "", "love " * 24,
                          "xyzzy love", "love"])
    assert r.dtype == torch.float64 and r.shape == (7,)
    assert r[0] == 0 and r[1] > 0.5 and r[2] < -0.5 and r[3] == 0
    assert r[4] > 0.99 and r[5] == r[6]  # saturates near 1; an unknown word counts for nothing
    assert text.gold_reward([]).shape == (0,)
    with pytest.raises(TypeError, match="texts"):
        text.gold_reward("one text")


def test_distinct_n_and_the_corpus_share() -> None:
    assert text.distinct_n(["a b a b", "a b"], 2) == pytest.approx(2 / 4)
    assert text.distinct_n(["Love, love!", "love"], 1) == pytest.approx(1 / 3)
    assert np.isnan(text.distinct_n(["one"], 2))
    known = text.corpus_ngrams(["The cat sat.", "A dog"], 1)
    assert text.corpus_share(["the dog <unk>"], known, 1) == pytest.approx(2 / 3)  # <unk> is no corpus word
    with pytest.raises(ValueError, match="n must"):
        text.distinct_n(["a"], 0)


# --- sampling and token_kl -------------------------------------------------------------------------------


def test_draw_samples_the_softmax() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -torch.inf, 0.5]]).expand(40_000, 5)
    y = draw(logits, _gen(0))
    freq = torch.bincount(y, minlength=5).double() / len(y)
    p = torch.softmax(logits[0].double(), -1)
    assert freq[3] == 0
    assert torch.all((freq - p).abs() < 4 * torch.sqrt(p * (1 - p) / len(y)) + 1e-12)


def test_sampling_with_the_cache_draws_what_full_forward_passes_draw(pretrained) -> None:
    model, tok = pretrained
    r = text.sample_responses(model, tok, 16, 12, generator=_gen(3))
    T = r.tokens.shape[1]
    assert r.mask[:, 0].all() and (r.mask[:, 1:] <= r.mask[:, :-1]).all()  # a prefix of each row
    eos = r.tokens == tok.eos_token_id
    assert ((eos & r.mask).sum(-1) <= 1).all() and (r.tokens[~r.mask] == tok.pad_token_id).all()
    assert torch.equal(r.mask.sum(-1) - 1 == torch.arange(T).expand(16, T).masked_fill(~eos, -1).amax(-1),
                       eos.any(-1)) or not eos.any()  # the end token is the last action where it occurs
    # the same generator, every step a full forward pass over the prefix: the same tokens
    g, prefix = _gen(3), torch.full((16, 1), tok.bos_token_id)
    with torch.no_grad():
        for _ in range(T):
            y = draw(model(input_ids=prefix).logits[:, -1], g)
            prefix = torch.cat([prefix, y[:, None]], dim=1)
    assert torch.equal(prefix[:, 1:][r.mask], r.tokens[r.mask])
    again = text.sample_responses(model, tok, 16, 12, generator=_gen(3))
    assert torch.equal(again.tokens, r.tokens)


def test_token_kl_equals_a_direct_computation_from_the_logits(pretrained) -> None:
    model, tok = pretrained
    policy = _perturbed(model)
    texts = ["Many hands make light work.", "I love it, truly!", "zork"]
    got = text.token_kl(policy, model, tok, texts)
    for t, r in zip(texts, got, strict=True):
        ids = [tok.bos_token_id, *tok(t, add_special_tokens=False).input_ids, tok.eos_token_id]
        with torch.no_grad():  # one text at a time, no padding; logits in float64
            lp = torch.log_softmax(policy(input_ids=torch.tensor([ids])).logits[0, :-1].double(), -1)
            lq = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].double(), -1)
        direct = (lp.exp() * (lp - lq)).sum(-1).numpy()
        assert r.tokens == tuple(tok.convert_ids_to_tokens(ids[1:]))
        np.testing.assert_allclose(r.kl, direct, rtol=1e-4, atol=1e-6)
        assert r.total == pytest.approx(direct.sum(), rel=1e-4)
        chosen = torch.tensor(ids[1:])[:, None]  # the log-ratio at each token of the text itself
        k1 = (lp.gather(-1, chosen) - lq.gather(-1, chosen)).squeeze(-1).numpy()
        np.testing.assert_allclose(r.k1, k1, rtol=1e-4, atol=1e-5)
        assert (r.k1 < 0).any() and (r.k1 > 0).any()  # a sampled log-ratio takes either sign
    assert got[0].tokens[-1] == "</s>" and (got[0].kl > 0).all()
    assert text.token_kl(policy, model, tok, texts, end=False)[0].tokens[-1] == "##."
    assert all((r.kl == 0).all() for r in text.token_kl(model, model, tok, texts))
    with pytest.raises(TypeError, match="texts"):
        text.token_kl(policy, model, tok, "one text")
    with pytest.raises(TypeError, match="reference"):
        text.token_kl(policy, "model", tok, texts)


def test_position_kl_is_the_exact_kl_of_the_policys_own_responses_by_position(pretrained) -> None:
    model, tok = pretrained
    policy = _perturbed(model)
    got = text.position_kl(policy, model, tok, 40, 12, generator=_gen(3))
    r = text.sample_responses(policy, tok, 40, 12, generator=_gen(3))  # the same draws
    with torch.no_grad():
        lp = torch.log_softmax(response_logits(policy, tok.bos_token_id, r.tokens).double(), -1)
        lq = torch.log_softmax(response_logits(model, tok.bos_token_id, r.tokens).double(), -1)
    direct = ((lp.exp() * (lp - lq)).sum(-1) * r.mask).mean(0).numpy()  # (T,): ended responses count 0
    assert got.kl.shape == got.running.shape == (12,)
    np.testing.assert_allclose(got.kl[: direct.size], direct, rtol=1e-4, atol=1e-7)
    assert (got.kl[direct.size :] == 0).all()
    np.testing.assert_allclose(got.running[: direct.size], r.mask.double().mean(0).numpy())
    assert got.running[0] == 1.0 and np.all(np.diff(got.running) <= 0)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got.per_running[: direct.size], direct / r.mask.double().mean(0).numpy(),
                                   rtol=1e-4)
    assert float(text.position_kl(model, model, tok, 8, 12, generator=_gen(0)).kl.sum()) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        text.position_kl(policy, model, tok, 0, 12, generator=_gen(0))
    with pytest.raises(TypeError, match="policy"):
        text.position_kl("policy", model, tok, 8, 12, generator=_gen(0))


def test_response_logits_are_those_each_token_was_drawn_from(pretrained) -> None:
    model, tok = pretrained
    tokens = torch.tensor([[5 + 10, 20, tok.eos_token_id, 0]])
    with torch.no_grad():
        full = model(input_ids=torch.tensor([[tok.bos_token_id, 15, 20, tok.eos_token_id]])).logits
        assert torch.allclose(response_logits(model, tok.bos_token_id, tokens)[0, :3], full[0, :3], atol=1e-5)


# --- the trainer -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, match", [
    ({"beta": -0.1}, ValueError, "beta"),
    ({"beta": float("nan")}, ValueError, "beta"),
    ({"steps": 0}, ValueError, "steps"),
    ({"steps": 2.0}, TypeError, "steps"),
    ({"batch_size": 1}, ValueError, "batch_size"),
    ({"lr": 0.0}, ValueError, "lr"),
    ({"max_new_tokens": 65}, ValueError, "max_new_tokens"),
    ({"max_grad_norm": 0}, ValueError, "max_grad_norm"),
])
def test_text_train_config_rejects_bad_fields(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        text.TextTrainConfig(**kwargs)


def test_train_text_rejects_bad_arguments(pretrained) -> None:
    model, tok = pretrained
    config = text.TextTrainConfig(steps=1, batch_size=2)
    with pytest.raises(ValueError, match="reward must be 'gold' .* or 'proxy'"):
        text.train_text(model, tok, config, reward="vader", generator=_gen())
    with pytest.raises(TypeError, match="config"):
        text.train_text(model, tok, {"beta": 0.1}, generator=_gen())
    with pytest.raises(TypeError, match="generator"):
        text.train_text(model, tok, config, generator=0)
    with pytest.raises(TypeError, match="tokenizer"):
        text.train_text(model, None, config, generator=_gen())


def test_train_text_records_every_step_through_the_librarys_objective(pretrained, monkeypatch) -> None:
    model, tok = pretrained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []
    library = trainer_module.compute_rlhf_objective

    def spy(*args, **kwargs):
        calls.append((args[5], kwargs["estimator"]))
        return library(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "compute_rlhf_objective", spy)
    config = text.TextTrainConfig(beta=0.1, steps=3, batch_size=8, max_new_tokens=6)
    run = text.train_text(model, tok, config, generator=_gen(0))
    assert calls == [(0.1, "k1")] * 4
    for f in trainer_module.FIELDS:
        assert getattr(run, f).shape == (4,)
    assert run.kl[0] == 0 and run.k1[0] == 0 and run.k3[0] == 0 and run.kl[-1] > 0
    assert len(run.samples) == 8 and all(isinstance(s, str) for s in run.samples)
    assert (run.length <= 6).all()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the reference is untouched
    assert all(p.requires_grad for p in model.parameters())
    again = text.train_text(model, tok, config, generator=_gen(0))
    assert np.array_equal(again.kl, run.kl) and again.samples == run.samples  # one thread: bit-identical


def test_without_the_penalty_the_policy_collapses_and_with_it_does_not(pretrained) -> None:
    """A tiny budget, the book's run shrunk 30 times (24 steps of 16 responses of at most 8 tokens, at
    three times the learning rate): without the penalty the policy collapses onto a few positive words,
    its gold near 1, its KL over 30 nats, its distinct-2 low; with β = 0.5 it stays as varied as the base
    model, its KL a fraction of that, its gold hardly moved. (At this learning rate and batch size the
    sampling noise alone drifts the policy some nats away, which the penalty pulls back only slowly: the
    penalised KL is not 0.) Measured over the last 4 batches; the same holds for seeds 1 and 2."""
    model, tok = pretrained
    configs = {beta: text.TextTrainConfig(beta=beta, steps=24, batch_size=16, lr=3e-3, max_new_tokens=8)
               for beta in (0.0, 0.5)}
    runs = {beta: text.train_text(model, tok, c, generator=_gen(0)) for beta, c in configs.items()}
    free, penalised = runs[0.0].final(last=4), runs[0.5].final(last=4)
    assert free.distinct_2 < 0.2 and free.kl > 30 and free.gold > 0.9
    assert penalised.distinct_2 > 0.85 and penalised.kl < free.kl / 3 and penalised.gold < 0.5
    assert runs[0.0].distinct_2[0] > 0.85 and runs[0.0].kl[0] == 0  # the base model's batch


# --- the learned proxy reward ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxy() -> text.ProxyReward:
    return text.load_proxy_reward()


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"pairs": 0}, ValueError, "ProxyConfig.pairs must be an int >= 1"),
    ({"label_temperature": -1.0}, ValueError, "ProxyConfig.label_temperature must be a finite number > 0"),
    ({"lr": 0.0}, ValueError, "ProxyConfig.lr"),
    ({"epochs": 1.5}, TypeError, "ProxyConfig.epochs must be an int"),
])
def test_proxy_config_rejects_bad_fields(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        text.ProxyConfig(**kwargs)


def test_comparisons_are_labelled_by_the_gold_with_bradley_terry_noise(pretrained) -> None:
    """The first response wins with probability sigmoid((g_a - g_b) / tau): at a tiny tau the labels are
    the gold's order (ties a coin flip), at a huge one a coin flip throughout; the texts and their gold
    differences do not depend on tau (the same draws)."""
    model, tok = pretrained
    sharp = text.comparisons(model, tok, 256, text.ProxyConfig(label_temperature=1e-9), _gen(3))
    blunt = text.comparisons(model, tok, 256, text.ProxyConfig(label_temperature=1e9), _gen(3))
    assert sharp.a == blunt.a and sharp.b == blunt.b and len(sharp.a) == 256
    assert torch.equal(sharp.gold_difference, text.gold_reward(sharp.a) - text.gold_reward(sharp.b))
    unequal = sharp.gold_difference != 0
    assert unequal.double().mean() > 0.5
    assert torch.equal(sharp.labels[unequal] > 0.5, sharp.gold_difference[unequal] > 0)
    agreement = ((blunt.labels > 0.5) == (blunt.gold_difference > 0))[unequal].double().mean()
    assert 0.35 < agreement < 0.65


def test_proxy_reward_scores_texts_like_the_gold_reward(proxy) -> None:
    scores = proxy(["i love it.", "what a wonderful day.", "i hate it.", "this is terrible."])
    assert scores.dtype == torch.float64 and scores.shape == (4,) and not scores.requires_grad
    assert min(scores[:2]) > max(scores[2:])
    assert torch.equal(proxy([]), torch.zeros(0, dtype=torch.float64))
    batched = proxy(["i love it.", "i hate it."] * 3, batch_size=4)
    assert torch.allclose(batched, proxy(["i love it.", "i hate it."]).repeat(3), atol=1e-6)
    with pytest.raises(TypeError, match="texts must be a sequence of str"):
        proxy("i love it.")
    with pytest.raises(TypeError, match="LlamaForSequenceClassification with one label"):
        text.ProxyReward(text.load_pretrained()[0], proxy.tokenizer)


def test_the_stored_proxy_loads_offline_with_its_recorded_accuracies(pretrained, proxy, monkeypatch) -> None:
    """proxy.json's held-out accuracies, measured again on the same fresh pairs (seed + 1): the proxy
    ranks the gold's better response first more often than chance, less often than the noisy labels do
    (the ceiling)."""
    def no_network(*args, **kwargs):
        raise AssertionError("load_proxy_reward tried to open a connection")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    loaded = text.load_proxy_reward()
    assert isinstance(loaded.model, transformers.LlamaForSequenceClassification)
    assert loaded.model.dtype == torch.float32 and not loaded.model.training
    weights = text.PROXY_DIR / "model.safetensors"
    assert weights.stat().st_size < 10 * 2**20
    meta = text.proxy_metadata()
    assert meta["command"].startswith("python -m kltutorial.textrlhf proxy")
    config = text.ProxyConfig(**meta["config"])
    model, tok = pretrained
    held = text.comparisons(model, tok, config.validation_pairs, config, _gen(meta["seed"] + 1))
    measured = text.pair_accuracies(loaded, held)
    for key, value in meta["validation"].items():
        assert measured[key] == pytest.approx(value, abs=2e-4), key
    assert 0.55 < measured["gold_accuracy"] < measured["label_gold_agreement"]
    with pytest.raises(FileNotFoundError, match="textrlhf proxy"):
        text.load_proxy_reward(text.PROXY_DIR / "missing")


def test_train_proxy_fits_its_comparisons_and_leaves_the_base_model(pretrained) -> None:
    """A tiny training set (128 pairs, drawn first from the generator): the kept model's Bradley–Terry loss
    on its own pairs is below a constant score's, log 2; the kept epoch is the one of lowest validation
    loss; the base model is untouched, and a second run is bit-identical. (How well the proxy ranks new
    pairs is the stored proxy's test, above: a few hundred pairs only overfit.)"""
    from kltutorial.textrlhf.proxy import _bt_loss

    model, tok = pretrained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = text.ProxyConfig(pairs=128, validation_pairs=64, epochs=2)
    result = text.train_proxy(model, tok, config, generator=_gen(0))
    assert len(result.validation_loss) == 2
    assert result.best_epoch == 1 + int(np.argmin(result.validation_loss))
    assert set(result.accuracies) == {"label_accuracy", "gold_accuracy", "label_gold_agreement",
                                      "unequal_gold_share"}
    train = text.comparisons(model, tok, 128, config, _gen(0))
    with torch.no_grad():
        assert float(_bt_loss(result.proxy.model, tok, train.a, train.b, train.labels)) < np.log(2)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    again = text.train_proxy(model, tok, config, generator=_gen(0))
    assert again.validation_loss == result.validation_loss  # one thread: bit-identical
    with pytest.raises(TypeError, match="config must be a ProxyConfig"):
        text.train_proxy(model, tok, {"pairs": 8}, generator=_gen(0))
    with pytest.raises(TypeError, match="base must be a LlamaForCausalLM"):
        text.train_proxy(result.proxy.model, tok, config, generator=_gen(0))


def test_train_text_on_the_proxy_trains_on_the_proxys_scores(pretrained, proxy, monkeypatch) -> None:
    """reward="proxy": the objective receives the proxy's scores of the batch; both rewards are recorded."""
    model, tok = pretrained
    seen = []
    library = trainer_module.compute_rlhf_objective

    def spy(*args, **kwargs):
        seen.append(args[3].clone())
        return library(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "compute_rlhf_objective", spy)
    config = text.TextTrainConfig(beta=0.05, steps=2, batch_size=8, max_new_tokens=6)
    run = text.train_text(model, tok, config, reward="proxy", generator=_gen(0))
    assert run.reward == "proxy" and len(seen) == 3
    assert run.proxy[-1] == pytest.approx(float(proxy(list(run.samples)).mean()), abs=1e-6)
    assert run.gold[-1] == pytest.approx(float(text.gold_reward(list(run.samples)).mean()), abs=1e-12)
    assert float(seen[-1].mean()) == pytest.approx(run.proxy[-1], abs=1e-6)


# --- the stored runs -------------------------------------------------------------------------------------


def test_stored_runs_read_back_as_trained(pretrained, tmp_path) -> None:
    from kltutorial.textrlhf import runs as runs_module

    model, tok = pretrained
    config = text.TextTrainConfig(beta=0.05, steps=3, batch_size=8, max_new_tokens=6)
    trained = {"kept": text.train_text(model, tok, config, generator=_gen(0)),
               "records": text.train_text(model, tok, config, reward="proxy", generator=_gen(1))}
    path = tmp_path / "runs.npz"
    runs_module.write_runs(trained, path, command="test", keep=["kept"])
    back = runs_module.read_runs(path, model)
    assert list(back) == ["kept", "records"]
    for name, run in trained.items():
        for f in trainer_module.FIELDS:
            assert np.array_equal(getattr(back[name], f), getattr(run, f)), (name, f)
        assert back[name].samples == run.samples and back[name].config == run.config
        assert back[name].reward == run.reward
    assert back["records"].policy is None and runs_module.read_runs(path)["kept"].policy is None
    for key, value in trained["kept"].policy.state_dict().items():
        assert torch.equal(back["kept"].policy.state_dict()[key], value.half().float()), key
    meta = runs_module.read_metadata(path)
    assert meta["command"] == "test" and {"versions", "machine", "date"} <= set(meta)
    assert runs_module.largest_difference(back["kept"], trained["kept"], 3) == 0
    assert runs_module.largest_difference(back["records"], trained["kept"], 3) > 0
    with pytest.raises(ValueError, match="steps 0 to 9"):
        runs_module.largest_difference(back["kept"], trained["kept"], 9)
    with pytest.raises(ValueError, match="keep names runs that are not in runs"):
        runs_module.write_runs(trained, path, keep=["missing"])
    with pytest.raises(ValueError, match="name must be one of"):
        runs_module.book_config("gold-1")
    assert runs_module.book_config("proxy-0") == ("proxy", text.TextTrainConfig(beta=0.0, steps=400))


def test_gold_peak_reads_the_running_mean() -> None:
    from kltutorial.textrlhf.metrics import gold_peak, running_mean

    gold = np.array([0.0, 1.0, 0.0, 0.6, 0.6, 0.6, 0.0])
    assert np.allclose(running_mean(gold, 3), [0.0, 0.5, 1 / 3, 1.6 / 3, 0.4, 0.6, 0.4])
    assert np.array_equal(running_mean(gold, 1), gold)

    class Run:  # a TextTrainResult's gold
        pass

    run = Run()
    run.gold = gold
    assert gold_peak(run, window=1) == 1 and gold_peak(run, window=3) == 5
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        running_mean(gold, 0)
    with pytest.raises(ValueError, match="one-dimensional"):
        running_mean(gold.reshape(7, 1), 2)
    with pytest.raises(TypeError, match="TextTrainResult"):
        gold_peak(object())


def test_next_word_shift_ranks_the_words_the_policy_raised_most(pretrained) -> None:
    model, tok = pretrained
    policy = _perturbed(model, seed=4, scale=0.05)
    shifts = text.next_word_shift(policy, model, tok, "the", top=3)
    ids = torch.tensor([[tok.bos_token_id, *tok("the", add_special_tokens=False).input_ids]])
    with torch.no_grad():
        p = torch.softmax(policy(input_ids=ids).logits[0, -1].double(), -1)
        q = torch.softmax(model(input_ids=ids).logits[0, -1].double(), -1)
    best = torch.topk(p - q, 3).indices.tolist()
    assert [s.word for s in shifts] == tok.convert_ids_to_tokens(best)
    assert [s.policy for s in shifts] == [float(p[i]) for i in best]
    assert [s.reference for s in shifts] == [float(q[i]) for i in best]
    assert shifts[0].policy - shifts[0].reference >= shifts[-1].policy - shifts[-1].reference > 0
    first = text.next_word_shift(policy, model, tok, "", top=1)  # the first word: after <s> alone
    assert len(first) == 1
    with pytest.raises(TypeError, match="prefix must be a str"):
        text.next_word_shift(policy, model, tok, None)
    with pytest.raises(ValueError, match="top"):
        text.next_word_shift(policy, model, tok, "the", top=0)


def test_token_kl_in_batches_keeps_the_order_and_the_values(corpus, pretrained) -> None:
    """More texts than one forward pass takes (128), of every length: the same rows, in the order given,
    as each text scored on its own."""
    model, tok = pretrained
    policy = _perturbed(model, seed=5)
    texts = corpus.validation[:300]
    together = text.token_kl(policy, model, tok, texts)
    assert len(together) == 300
    for i in (0, 1, 127, 128, 200, 299):
        [alone] = text.token_kl(policy, model, tok, [texts[i]])
        assert together[i].tokens == alone.tokens
        assert np.allclose(together[i].kl, alone.kl, atol=1e-5)


@pytest.mark.parametrize("name", ["gold-0.05", "proxy-0"])
def test_the_stored_runs_are_what_the_code_trains(pretrained, name) -> None:
    """book/data/text-runs.npz, checked against the code: the first 3 steps of a run trained again agree
    with the stored record. Bit for bit on the machine that wrote the file (one torch thread); the sampled
    words depend on the last bits of the arithmetic, so on another CPU regenerate the file with the
    command it records."""
    from kltutorial.textrlhf import runs as runs_module

    path = pathlib.Path(__file__).resolve().parents[1] / "book" / "data" / "text-runs.npz"
    meta = runs_module.read_metadata(path)
    assert meta["command"] == "python -m kltutorial.textrlhf.runs book/data/text-runs.npz"
    assert [r["name"] for r in meta["runs"]] == list(runs_module.BOOK_RUNS)
    stored = runs_module.read_runs(path)[name]
    model, tok = pretrained
    live = runs_module.train_book_run(name, model, tok, steps=3)
    gap = runs_module.largest_difference(live, stored, 3)
    assert gap < 1e-4, (f"{name}: the first steps trained today differ from the stored run by {gap:.3g} "
                        f"nats (stored on {meta['machine']}, {meta['date']}); if the training code "
                        f"changed, regenerate: {meta['command']}")


# --- the annotated training step of section 8 --------------------------------------------------------


def test_the_annotated_step_has_the_gradient_of_the_librarys_objective(pretrained) -> None:
    from kltutorial import compute_rlhf_objective
    from kltutorial.textrlhf.generation import sample_unchecked
    from kltutorial.textrlhf.step import kl_penalised_step

    model, tok = pretrained
    policy, beta = _perturbed(model), 0.1
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)  # a step that moves nothing: the gradient stays
    out = kl_penalised_step(policy, model, tok, opt, beta=beta, batch_size=16, max_grad_norm=None,
                            generator=_gen(5))
    mine = [p.grad.clone() for p in policy.parameters()]
    # the same batch (the same draws), through the library's objective
    r = sample_unchecked(policy, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, 16, 24, _gen(5))
    scores = text.gold_reward(text.decode_responses(tok, r))
    with torch.no_grad():
        ref_logits = response_logits(model, tok.bos_token_id, r.tokens)
    policy.zero_grad()
    loss, info = compute_rlhf_objective(response_logits(policy, tok.bos_token_id, r.tokens), ref_logits,
                                        r.tokens, scores, r.mask, beta, estimator="k1")
    loss.backward()
    for a, p in zip(mine, policy.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-7)
    assert out["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    assert out["score"] == pytest.approx(float(scores.mean()))
    assert out["k1"] == pytest.approx(info["mean_kl"], rel=1e-5) and out["k1"] != 0.0
    # clipping, as train_text: the norm after the step's clipping is at most max_grad_norm
    kl_penalised_step(policy, model, tok, opt, beta=beta, batch_size=16, max_grad_norm=1e-3,
                      generator=_gen(5))
    assert torch.nn.utils.get_total_norm([p.grad for p in policy.parameters()]) <= 1e-3 * (1 + 1e-5)
    with pytest.raises(ValueError, match="beta"):
        kl_penalised_step(policy, model, tok, opt, beta=-1.0, generator=_gen(0))
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        kl_penalised_step(policy, model, tok, opt, beta=float("inf"), generator=_gen(0))
    with pytest.raises(ValueError, match="max_grad_norm"):
        kl_penalised_step(policy, model, tok, opt, beta=0.1, max_grad_norm=0.0, generator=_gen(0))
    with pytest.raises(ValueError, match="batch_size must be >= 2"):
        kl_penalised_step(policy, model, tok, opt, beta=0.1, batch_size=1, generator=_gen(0))
    with pytest.raises(TypeError, match="optimizer"):
        kl_penalised_step(policy, model, tok, "adam", beta=0.1, generator=_gen(0))
