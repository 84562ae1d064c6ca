"""``weighted_gram``: the syrk split equals the plain product for weights of any sign."""

import numpy as np
import pytest
from gpinfer_ep.gram import weighted_gram


@pytest.mark.parametrize("signs", ["mixed", "positive", "negative", "zero"])
def test_weighted_gram_equals_dense_product(signs):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((7, 40))
    d = {"mixed": rng.standard_normal(40), "positive": rng.random(40) + 0.1,
         "negative": -rng.random(40) - 0.1, "zero": np.zeros(40)}[signs]
    G = weighted_gram(A, d)
    np.testing.assert_allclose(G, (A * d) @ A.T, rtol=1e-12, atol=1e-12)
    assert np.array_equal(G, G.T)


def test_weighted_gram_rejects_wrong_weight_shape():
    with pytest.raises(ValueError, match=r"weights must have shape \(4,\)"):
        weighted_gram(np.ones((2, 4)), np.ones(3))
