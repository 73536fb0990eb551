"""kltutorial.studies.dynamics: the hand-made per-token KL curves of section 10."""

import numpy as np
import pytest

from kltutorial.studies.dynamics import illustrative_token_kl_patterns


def test_token_patterns_shapes_and_shapes_of_curves():
    pats = illustrative_token_kl_patterns(seq_len=60, rng=np.random.default_rng(12), noise=0.0)
    assert list(pats) == ["reformulated opening", "novel conclusion", "specific word choices"]
    assert all(p.shape == (60,) and np.all(p > 0) for p in pats.values())
    opening, conclusion, spiky = pats.values()
    assert np.all(np.diff(opening) < 0) and np.all(np.diff(conclusion) > 0)
    assert np.sum(spiky > 1.0) == 5 and np.all(spiky[spiky < 1.0] == 0.2)
    assert spiky.max() <= 3.0


def test_token_patterns_are_seeded():
    a = illustrative_token_kl_patterns(rng=np.random.default_rng(13))
    b = illustrative_token_kl_patterns(rng=np.random.default_rng(13))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
        assert np.all(a[key] > 0)


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        ({"rng": None}, TypeError, "rng"),
        ({"rng": 0}, TypeError, "rng"),
        ({"seq_len": 5}, ValueError, "seq_len"),
        ({"seq_len": 2.5}, TypeError, "seq_len"),
        ({"noise": -0.1}, ValueError, "noise"),
    ],
)
def test_bad_input(kwargs, exc, name):
    kwargs = {"rng": np.random.default_rng(0), **kwargs}  # a copy: the parameters are shared by every run
    with pytest.raises(exc, match=name):
        illustrative_token_kl_patterns(**kwargs)
