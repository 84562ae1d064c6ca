"""Built-in synthetic datasets: Breiman's waveform, the seed-000 2-D three-class GP problem and
the large, low-dimensional ``scale`` sets (hundreds of thousands of points)."""

from __future__ import annotations

import numpy as np

from gpinfer.data.base import Dataset
from gpinfer.errors import InputError
from gpinfer.numerics.cholesky import jittered_cholesky

Array = np.ndarray

#: number of attributes of Breiman's waveform (version 1)
WAVEFORM_D = 21


def waveform_base_waves() -> Array:
    """The three triangular base waves ``h [3, 21]`` on ``t = 1..21``.

    ``h1(t) = max(6 - |t - 11|, 0)``, ``h2(t) = h1(t - 4)``, ``h3(t) = h1(t + 4)``
    (Breiman et al. 1984; ep-sep-multiclass spec §5.1).
    """
    t = np.arange(1, WAVEFORM_D + 1, dtype=float)
    h1 = np.maximum(6.0 - np.abs(t - 11.0), 0.0)
    h2 = np.maximum(6.0 - np.abs(t - 4.0 - 11.0), 0.0)
    h3 = np.maximum(6.0 - np.abs(t + 4.0 - 11.0), 0.0)
    return np.stack([h1, h2, h3])


#: the two base waves mixed by each class: class 0 = (h1, h2), 1 = (h1, h3), 2 = (h2, h3)
WAVEFORM_PAIRS = ((0, 1), (0, 2), (1, 2))


def waveform(n: int = 1000, seed: int = 0, noise: float = 1.0) -> Dataset:
    """Breiman's waveform data (version 1): 3 equiprobable classes, 21 attributes.

    Class ``c`` with base pair ``(a, b)`` (see ``WAVEFORM_PAIRS``) gives
    ``x = u h_a + (1 - u) h_b + noise * eps`` with ``u ~ U(0, 1)`` and ``eps ~ N(0, I_21)``.
    Returns ``X [n, 21]`` and ``y [n]`` in ``0..2``; the same ``seed`` gives the same data.
    """
    n = _positive_int(n, "n", "waveform")
    if not np.isfinite(noise) or noise < 0:
        raise InputError(f"waveform: noise must be a finite standard deviation >= 0, got {noise}")
    rng = np.random.default_rng(seed)
    h = waveform_base_waves()
    y = rng.integers(0, 3, size=n)
    u = rng.uniform(0.0, 1.0, size=n)
    pairs = np.asarray(WAVEFORM_PAIRS)[y]  # [n, 2]
    X = u[:, None] * h[pairs[:, 0]] + (1.0 - u[:, None]) * h[pairs[:, 1]]
    X = X + noise * rng.standard_normal((n, WAVEFORM_D))
    return Dataset(
        name="waveform",
        X=X,
        y=y.astype(np.int64),
        class_names=["h1+h2", "h1+h3", "h2+h3"],
        feature_names=[f"t{t}" for t in range(1, WAVEFORM_D + 1)],
        description=(
            f"Breiman's waveform (version 1), {n} points generated with seed {seed}: "
            "3 equiprobable classes, each a random convex combination of two of three "
            f"triangular base waves on 21 points plus N(0, {noise}^2) noise."
        ),
    )


def synthetic_2d_three_class(
    n: int = 1000,
    seed: int = 0,
    n_test: int = 0,
    amplitude: float = 1.0,
    lengthscale: float = 1.0,
    noise: float = 1e-2,
    n_classes: int = 3,
    low: float = -2.5,
    high: float = 2.5,
) -> Dataset:
    """The seed-000 synthetic problem (ep-sep-multiclass spec §5.3, pitfall P26).

    ``x ~ U([low, high]^2)``; independent latents ``f^c ~ GP(0, k)`` with
    ``k(x, x') = amplitude * exp(-|x - x'|^2 / (2 lengthscale^2))`` drawn jointly at the
    ``n + n_test`` inputs; ``y = argmax_c (f^c(x) + eps^c)`` with ``eps^c ~ N(0, noise)``
    (``noise`` is a variance). Defaults are the spec's generating values (amplitude 1,
    length-scale 1, noise variance 1e-2, N = 1000, 3 classes).

    Returns ``X [n, 2]``, ``y [n]``; with ``n_test > 0`` also ``X_test [n_test, 2]`` and
    ``y_test`` from the same latent draw. ``extras["F"] [n, C]`` and ``extras["F_test"]`` hold
    the noise-free latent values.
    """
    n = _positive_int(n, "n", "synthetic2d")
    n_test = _positive_int(n_test, "n_test", "synthetic2d", allow_zero=True)
    n_classes = _positive_int(n_classes, "n_classes", "synthetic2d")
    _check_synthetic_2d(amplitude, lengthscale, noise, low, high)
    X, F, y = _gp_argmax_draw(np.random.default_rng(seed), n + n_test, n_classes, amplitude,
                              lengthscale, noise, low, high)
    extras = {"F": F[:n]}
    X_test = y_test = None
    if n_test:
        X_test, y_test = X[n:], y[n:].astype(np.int64)
        extras["F_test"] = F[n:]
    return Dataset(
        name="synthetic2d",
        X=X[:n],
        y=y[:n].astype(np.int64),
        X_test=X_test,
        y_test=y_test,
        class_names=[str(c) for c in range(n_classes)],
        feature_names=["x1", "x2"],
        description=(
            f"2-D {n_classes}-class problem (seed paper 000, Fig. 3): x ~ U([{low}, {high}]^2), "
            f"latents from a GP prior (RBF, amplitude {amplitude}, length-scale {lengthscale}), "
            f"y = argmax of latents plus N(0, {noise}) noise; {n} points, seed {seed}."
        ),
        extras=extras,
    )


def _check_synthetic_2d(amplitude: float, lengthscale: float, noise: float, low: float,
                        high: float) -> None:
    """``InputError`` unless amplitude and length-scale are finite and positive, the noise
    variance finite and non-negative, and ``low < high``."""
    for label, v in (("amplitude", amplitude), ("lengthscale", lengthscale)):
        if not np.isfinite(v) or v <= 0:
            raise InputError(f"synthetic2d: {label} must be finite and > 0, got {v}")
    if not np.isfinite(noise) or noise < 0:
        raise InputError(f"synthetic2d: noise must be a finite variance >= 0, got {noise}")
    if not high > low:
        raise InputError(f"synthetic2d: need low < high, got low={low}, high={high}")


def _gp_argmax_draw(rng: np.random.Generator, m: int, n_classes: int, amplitude: float,
                    lengthscale: float, noise: float, low: float, high: float
                    ) -> tuple[Array, Array, Array]:
    """``m`` inputs ``X [m, 2] ~ U([low, high]^2)``, ``C = n_classes`` independent RBF-GP
    latents ``F [m, C]`` drawn jointly at them, and the labels ``y [m] = argmax_c (F + eps)``,
    ``eps ~ N(0, noise)``; draws from ``rng`` in that order."""
    X = rng.uniform(low, high, size=(m, 2))
    sq = np.sum((X[:, None, :] - X[None, :, :]) ** 2, axis=-1)
    K = amplitude * np.exp(-0.5 * sq / lengthscale**2)
    L = jittered_cholesky(K, name="synthetic2d prior covariance", start=1e-10).L
    F = L @ rng.standard_normal((m, n_classes))  # [m, C]
    y = np.argmax(F + np.sqrt(noise) * rng.standard_normal((m, n_classes)), axis=1)
    return X, F, y


#: class fractions of ``scale_synthetic``: balanced, or unbalanced about 1:4 (binary) /
#: 6:3:1 (three classes)
SCALE_FRACTIONS = {
    (2, False): (0.5, 0.5),
    (2, True): (0.8, 0.2),
    (3, False): (1 / 3, 1 / 3, 1 / 3),
    (3, True): (0.6, 0.3, 0.1),
}


def scale_synthetic(
    n: int = 200_000,
    d: int = 3,
    n_classes: int = 2,
    unbalanced: bool = True,
    sharpness: float = 8.0,
    seed: int = 0,
) -> Dataset:
    """A large, nearly separable, non-linear classification set (for scale checks).

    ``x ~ N(0, I_d)``; one latent ``f(x) = 2.5 sin(1.5 x_1) + x_2^2 - 1.5 x_3 + g(x_4..x_d)`` with
    ``g = sum_j a_j sin(1.2 x_j + phi_j) / sqrt(d - 3)`` (``a ~ N(0, 1)``, ``phi ~ U(0, 2 pi)``;
    ``d >= 3``), ordinal classes cut at the quantiles of ``f`` that give ``SCALE_FRACTIONS``
    and labels ``y = #{k : f + e > t_k}`` with logistic noise ``e`` of scale ``1 / sharpness``
    (a few per cent of points near the boundaries flip; the Bayes error is small but not zero,
    so the classes are not linearly separable). Shaped like the skin-segmentation set on which
    vi-taylor once failed: ``n = 2e5``, ``d = 3``, 1:4 classes. Returns ``X [n, d]``, ``y [n]``.
    """
    n = _positive_int(n, "n", "scale")
    d = _positive_int(d, "d", "scale")
    if d < 3:
        raise InputError(f"scale: d must be at least 3, got {d}")
    if (n_classes, bool(unbalanced)) not in SCALE_FRACTIONS:
        raise InputError(f"scale: n_classes must be 2 or 3, got {n_classes!r}")
    if not np.isfinite(sharpness) or sharpness <= 0:
        raise InputError(f"scale: sharpness must be finite and > 0, got {sharpness}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    f = 2.5 * np.sin(1.5 * X[:, 0]) + X[:, 1] ** 2 - 1.5 * X[:, 2]
    if d > 3:
        a = rng.standard_normal(d - 3)
        phase = rng.uniform(0.0, 2.0 * np.pi, d - 3)
        f += np.sin(1.2 * X[:, 3:] + phase) @ a / np.sqrt(d - 3)
    fractions = SCALE_FRACTIONS[(n_classes, bool(unbalanced))]
    cuts = np.quantile(f, np.cumsum(fractions)[:-1])
    u = rng.uniform(np.finfo(float).tiny, 1.0, n)
    noisy = f + np.log(u / (1.0 - u)) / sharpness
    y = np.searchsorted(cuts, noisy).astype(np.int64)
    shape = "unbalanced" if unbalanced else "balanced"
    return Dataset(
        name="scale",
        X=X,
        y=y,
        class_names=[str(c) for c in range(n_classes)],
        feature_names=[f"x{j + 1}" for j in range(d)],
        description=(
            f"synthetic scale set: {n} points, {d} features, {n_classes} {shape} ordinal classes "
            f"{tuple(round(p, 2) for p in fractions)} of a non-linear latent with logistic "
            f"label noise (sharpness {sharpness}), seed {seed}."
        ),
    )


def _positive_int(v: int, label: str, who: str, allow_zero: bool = False) -> int:
    ok = isinstance(v, int | np.integer) and not isinstance(v, bool)
    if not ok or v < (0 if allow_zero else 1):
        bound = ">= 0" if allow_zero else ">= 1"
        raise InputError(f"{who}: {label} must be an integer {bound}, got {v!r}")
    return int(v)


#: layouts of ``stress_binary``
STRESS_LAYOUTS = ("tube", "clusters")


def _arc(t: Array) -> Array:
    """Points ``[len(t), 3]`` on a curved arc through the colour cube ``[0, 255]^3``
    (``t in [0, 1]``)."""
    return np.stack([60.0 + 150.0 * t,
                     40.0 + 120.0 * t + 45.0 * np.sin(np.pi * t),
                     30.0 + 90.0 * t ** 2], axis=1)


def _arc_distance(X: Array, n_knots: int = 256) -> Array:
    """Distance ``[n]`` of each row of ``X [n, 3]`` to the arc of ``_arc`` (polyline of knots)."""
    knots = _arc(np.linspace(0.0, 1.0, n_knots))
    out = np.empty(X.shape[0])
    for start in range(0, X.shape[0], 20_000):
        block = X[start:start + 20_000]
        d2 = np.sum(block**2, 1)[:, None] - 2.0 * block @ knots.T + np.sum(knots**2, 1)[None]
        out[start:start + 20_000] = np.sqrt(np.maximum(d2.min(axis=1), 0.0))
    return out


def _check_stress(ratio: float, layout: str, flip: float,
                  scales: tuple[float, float, float]) -> np.ndarray:
    """``stress_binary``'s settings checked (``InputError`` naming the bad one); returns the
    feature scales ``[3]``."""
    if not np.isfinite(ratio) or ratio < 1.0:
        raise InputError(f"stress: ratio (negatives per positive) must be >= 1, got {ratio}")
    if layout not in STRESS_LAYOUTS:
        raise InputError(f"stress: layout must be one of {STRESS_LAYOUTS}, got {layout!r}")
    if not 0.0 <= flip < 0.5:
        raise InputError(f"stress: flip must be in [0, 0.5), got {flip}")
    scale_arr = np.asarray(scales, dtype=float)
    if scale_arr.shape != (3,) or not np.all(np.isfinite(scale_arr) & (scale_arr > 0)):
        raise InputError(f"stress: scales must be three finite positive numbers, got {scales}")
    return scale_arr


def _stress_tube(rng: np.random.Generator, n_pos: int, n_neg: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``layout="tube"``: positives ``[n_pos, 3]`` in a tube of radius 18 around the arc,
    negatives ``[n_neg, 3]`` outside it, and every point's signed margin ``[n]`` (positive:
    on its class's side)."""
    radius = 18.0
    t = rng.uniform(0.0, 1.0, n_pos)
    direction = rng.standard_normal((n_pos, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    r = radius * rng.uniform(0.0, 1.0, n_pos) ** (1.0 / 2.0)
    pos = _arc(t) + r[:, None] * direction
    neg = np.empty((0, 3))
    centres = np.array([[200.0, 60.0, 60.0], [60.0, 180.0, 200.0], [150.0, 150.0, 40.0]])
    while neg.shape[0] < n_neg:
        k = 2 * (n_neg - neg.shape[0]) + 100
        blob = rng.uniform(0.0, 1.0, k) < 0.25
        cand = rng.uniform(0.0, 255.0, (k, 3))
        cand[blob] = (centres[rng.integers(0, 3, int(blob.sum()))]
                      + 35.0 * rng.standard_normal((int(blob.sum()), 3)))
        neg = np.concatenate([neg, cand[_arc_distance(cand) > radius]])
    neg = neg[:n_neg]
    margin = np.concatenate([radius - _arc_distance(pos), _arc_distance(neg) - radius])
    return pos, neg, margin


def _stress_clusters(rng: np.random.Generator, n_pos: int, n_neg: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``layout="clusters"``: positives in four tight clusters, negatives in six broad ones
    and a uniform background kept 22 away from the positive centres; as ``_stress_tube``."""
    pos_c = rng.uniform(40.0, 215.0, (4, 3))
    neg_c = rng.uniform(20.0, 235.0, (6, 3))
    pos = pos_c[rng.integers(0, 4, n_pos)] + 9.0 * rng.standard_normal((n_pos, 3))
    background = rng.uniform(0.0, 1.0, n_neg) < 0.3
    neg = neg_c[rng.integers(0, 6, n_neg)] + 30.0 * rng.standard_normal((n_neg, 3))
    neg[background] = rng.uniform(0.0, 255.0, (int(background.sum()), 3))
    d_pos = np.min(np.linalg.norm(neg[:, None, :] - pos_c[None], axis=2), axis=1)
    neg = neg[d_pos > 22.0]  # a thin overlap only: refill from the background
    while neg.shape[0] < n_neg:
        cand = rng.uniform(0.0, 255.0, (2 * (n_neg - neg.shape[0]) + 100, 3))
        d = np.min(np.linalg.norm(cand[:, None, :] - pos_c[None], axis=2), axis=1)
        neg = np.concatenate([neg, cand[d > 22.0]])
    neg = neg[:n_neg]
    d_pos_pos = np.min(np.linalg.norm(pos[:, None, :] - pos_c[None], axis=2), axis=1)
    d_neg = np.min(np.linalg.norm(neg[:, None, :] - pos_c[None], axis=2), axis=1)
    return pos, neg, np.concatenate([22.0 - d_pos_pos, d_neg - 22.0])


def stress_binary(
    n: int = 200_000,
    ratio: float = 4.0,
    layout: str = "tube",
    scales: tuple[float, float, float] = (1.0, 1.0, 1.0),
    flip: float = 0.002,
    seed: int = 0,
) -> Dataset:
    """A skin-segmentation-like, imbalanced, nearly separable binary set (for the Taylor guard).

    Three colour-like features in ``[0, 255]``. ``layout="tube"``: the positives (class 1) fill a
    compact curved tube of radius 18 around an arc through the cube; the negatives are spread
    over the cube (three quarters uniform, one quarter in three broad blobs), with none inside
    the tube. ``layout="clusters"``: positives in four tight Gaussian clusters, negatives in
    six broad ones and a uniform background, separated by a small overlap. ``ratio``:
    negatives per positive (1 gives balanced classes, 20 about 4.8 % positives); ``flip``: the
    fraction of labels flipped among the points nearest the class boundary (the Bayes error is
    small but not zero). ``scales [3]``: each feature is multiplied by its scale after
    generation (features on very different scales; standardise before fitting as a user
    would). Returns ``X [n, 3]``, ``y [n]`` in ``{0, 1}``.
    """
    n = _positive_int(n, "n", "stress")
    scale_arr = _check_stress(ratio, layout, flip, scales)
    rng = np.random.default_rng(seed)
    n_pos = max(1, int(round(n / (1.0 + ratio))))
    n_neg = n - n_pos
    make = _stress_tube if layout == "tube" else _stress_clusters
    pos, neg, margin = make(rng, n_pos, n_neg)
    X = np.concatenate([pos, neg])
    y = np.concatenate([np.ones(n_pos, dtype=np.int64), np.zeros(n_neg, dtype=np.int64)])
    n_flip = int(round(flip * n))
    if n_flip:  # flip labels among the points nearest the boundary
        near = np.argsort(np.abs(margin))[: 20 * n_flip]
        y[rng.choice(near, n_flip, replace=False)] ^= 1
    order = rng.permutation(n)
    X, y = X[order] * scale_arr, y[order]
    return Dataset(
        name="stress",
        X=X,
        y=y,
        class_names=["0", "1"],
        feature_names=["x1", "x2", "x3"],
        description=(
            f"skin-like stress set: {n} points, 3 colour-like features scaled by "
            f"{tuple(float(s) for s in scale_arr)}, layout {layout}, {ratio:g}:1 negatives per "
            f"positive, {flip:g} of labels flipped near the boundary, seed {seed}."
        ),
    )
