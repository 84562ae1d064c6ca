"""The battery of tests every method plugin runs: subclass ``MethodTestSuite`` in the plugin.

Example (``plugins/gpinfer-laplace/tests/test_laplace.py``)::

    from gpinfer.testing import MethodTestSuite

    class TestLaplace(MethodTestSuite):
        method_name = "laplace"
        likelihood = "logit"

        def objective_and_gradient(self, X, y):
            ...  # (value fn, gradient fn, theta0) of the method's objective

Subclasses are collected by pytest (name them ``Test...``); the base class itself is not.
Every subclass with a ``method_name`` is recorded in ``SUITES`` so that a completeness test can
fail when a registered method has no suite. The data are small and generated with a fixed seed:
``N = 40`` points in ``D = 2`` dimensions, two or three classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.interfaces import FitResult, IterationInfo, Method
from gpinfer.testing.gradcheck import assert_gradient_close

if TYPE_CHECKING:
    from gpinfer.estimator import GPClassifier

Array = np.ndarray

__all__ = ["SUITES", "MethodTestSuite", "make_suite_data"]

#: names of the methods that have a ``MethodTestSuite`` subclass (filled on subclassing)
SUITES: set[str] = set()


def make_suite_data(n_classes: int = 2, n: int = 40, seed: int = 0) -> tuple[Array, Array]:
    """Overlapping Gaussian blobs: ``X [n, 2]`` float64 and ``y [n]`` int64 in ``0..C-1``.

    Class ``c`` is centred on a circle of radius 1.5 at angle ``2 pi c / C``, with unit noise,
    so that predictive probabilities are not saturated. Every class gets ``n // C`` or more points.
    """
    rng = np.random.default_rng(seed)
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    angles = 2.0 * np.pi * np.arange(n_classes) / n_classes
    centres = 1.5 * np.stack([np.cos(angles), np.sin(angles)], axis=1)  # [C, 2]
    X = centres[y] + rng.standard_normal((n, 2))
    return X, y.astype(np.int64)


class MethodTestSuite:
    """Reusable tests for one registered method; set the class attributes in a subclass.

    * ``method_name``: the registry name (required).
    * ``method_cls``: optionally the ``Method`` subclass itself, to test a method before it is
      registered (``docs/example_plugin`` does this).
    * ``method_options``: options passed to the method (dict or None).
    * ``likelihood``: likelihood name or object (``None``: the method's default).
    * ``n_classes``: 2 or 3, the number of classes in the generated data.
    * ``inducing``: ``M`` for methods with inducing points (count, fraction or ``None``).
    * ``max_iter``, ``optimize``: training budget for the fits in the suite.
    * ``permutation_atol``: tolerance for the label-permutation test (iterative methods may
      need a looser one); ``gradient_rtol`` / ``gradient_atol`` / ``gradient_eps``: for the
      finite-difference check.

    Implement ``objective_and_gradient`` to expose the method's objective for the gradient test.
    """

    method_name: ClassVar[str] = ""
    #: a ``Method`` subclass to test directly (e.g. before it is registered); else the registry
    method_cls: ClassVar[type[Method] | None] = None
    method_options: ClassVar[Mapping[str, Any] | None] = None
    likelihood: ClassVar[Any] = None
    n_classes: ClassVar[int] = 2
    inducing: ClassVar[Any] = None
    kernel: ClassVar[Any] = "rbf"
    max_iter: ClassVar[int] = 20
    optimize: ClassVar[bool] = True
    n_points: ClassVar[int] = 40
    seed: ClassVar[int] = 0
    permutation_atol: ClassVar[float] = 1e-4
    gradient_rtol: ClassVar[float] = 1e-5
    gradient_atol: ClassVar[float] = 1e-7
    gradient_eps: ClassVar[float] = 1e-6

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.method_name:
            SUITES.add(cls.method_name)

    # -- the hook a plugin implements ---------------------------------------------------------
    def objective_and_gradient(
        self, X: Array, y: Array
    ) -> tuple[Callable[[Array], float], Callable[[Array], Array], Array]:
        """The method's objective on ``X [N, D]``, ``y [N]`` (class indices) as a function of a
        parameter vector ``theta [P]`` (e.g. the kernel's unconstrained parameters):
        ``(value(theta) -> float, gradient(theta) -> [P], theta0 [P])``.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement objective_and_gradient(X, y) -> "
            "(value fn, gradient fn, theta0) so the suite can check the gradient"
        )

    # -- helpers ----------------------------------------------------------------------------------
    def data(self, n_classes: int | None = None) -> tuple[Array, Array]:
        """The suite's data: ``X [n_points, 2]``, ``y [n_points]`` int64 class indices."""
        return make_suite_data(n_classes or self.n_classes, n=self.n_points, seed=self.seed)

    def make_estimator(self, **overrides: Any) -> GPClassifier:
        """A ``GPClassifier`` for this method with the suite's settings (``overrides`` win)."""
        from gpinfer.estimator import GPClassifier

        params: dict[str, Any] = dict(
            method=self.method_cls or self.method_name,
            M=self.inducing,
            kernel=self.kernel,
            likelihood=self.likelihood,
            optimize=self.optimize,
            max_iter=self.max_iter,
            random_state=0,
            method_options=dict(self.method_options) if self.method_options else None,
        )
        params.update(overrides)
        return GPClassifier(**params)

    def method_class(self) -> type[Method]:
        from gpinfer import registry

        if self.method_cls is not None:
            return self.method_cls
        return registry.load_method(self.method_name)

    def _forbid_training(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make the method's ``fit`` fail loudly, to prove bad input is rejected before it."""

        def _fit(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("training started although the input was invalid")

        monkeypatch.setattr(self.method_class(), "fit", _fit)

    # -- the tests ---------------------------------------------------------------------------------
    def test_suite_is_configured(self) -> None:
        assert self.method_name, f"{type(self).__name__} must set method_name"
        assert self.n_classes in (2, 3), "n_classes must be 2 or 3"
        assert self.method_class() is not None

    def test_predict_proba_shape_and_rows_sum_to_one(self) -> None:
        X, y = self.data()
        est = self.make_estimator().fit(X, y)
        P = est.predict_proba(X)
        assert P.shape == (len(y), self.n_classes)
        assert np.all(np.isfinite(P))
        assert np.all(P >= 0.0) and np.all(P <= 1.0)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-8)
        np.testing.assert_array_equal(est.predict(X), est.classes_[np.argmax(P, axis=1)])
        assert isinstance(est.fit_result_, FitResult)
        assert np.isfinite(est.log_evidence_)

    def test_predict_f_shapes(self) -> None:
        X, y = self.data()
        est = self.make_estimator().fit(X, y)
        mean, var = est.predict_f(X[:7])
        n_latent = 1 if self.n_classes == 2 else self.n_classes
        assert mean.shape == (7, n_latent) and var.shape == (7, n_latent)
        assert np.all(np.isfinite(mean)) and np.all(var > 0.0)

    def test_callback_receives_iterations(self) -> None:
        X, y = self.data()
        seen: list[IterationInfo] = []
        self.make_estimator().fit(X, y, callback=seen.append)
        assert seen, "the method never called the fit callback"
        assert all(isinstance(info, IterationInfo) for info in seen)
        iterations = [info.iteration for info in seen]
        assert iterations == sorted(iterations)
        assert all(np.isfinite(info.objective) for info in seen)

    def test_deterministic_given_random_state(self) -> None:
        X, y = self.data()
        P1 = self.make_estimator().fit(X, y).predict_proba(X)
        P2 = self.make_estimator().fit(X, y).predict_proba(X)
        np.testing.assert_allclose(P1, P2, rtol=0, atol=1e-10)

    def test_label_permutation(self) -> None:
        """Permuting class labels permutes the probability columns (binary: mirrors them)."""
        X, y = self.data()
        C = self.n_classes
        P = self.make_estimator().fit(X, y).predict_proba(X)
        perm = np.roll(np.arange(C), 1)  # class c is renamed perm[c]; binary: 0 <-> 1
        P_perm = self.make_estimator().fit(X, perm[y]).predict_proba(X)
        np.testing.assert_allclose(P_perm[:, perm], P, atol=self.permutation_atol)

    def test_string_and_non_contiguous_labels(self) -> None:
        X, y = self.data()
        P = self.make_estimator().fit(X, y).predict_proba(X)
        names = np.array(["alpha", "beta", "gamma"][: self.n_classes])
        est = self.make_estimator().fit(X, names[y])
        np.testing.assert_array_equal(est.classes_, names)
        assert set(est.predict(X)) <= set(names)
        np.testing.assert_allclose(est.predict_proba(X), P, atol=1e-10)
        ints = np.array([3, 7, 11][: self.n_classes])
        est = self.make_estimator().fit(X, ints[y])
        np.testing.assert_array_equal(est.classes_, ints)
        np.testing.assert_allclose(est.predict_proba(X), P, atol=1e-10)

    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_rejects_non_finite_X(self, bad: float, monkeypatch: pytest.MonkeyPatch) -> None:
        X, y = self.data()
        X[3, 1] = bad
        self._forbid_training(monkeypatch)
        with pytest.raises(InputError, match="row 3"):
            self.make_estimator().fit(X, y)

    def test_rejects_mismatched_lengths(self, monkeypatch: pytest.MonkeyPatch) -> None:
        X, y = self.data()
        self._forbid_training(monkeypatch)
        with pytest.raises(InputError, match="inconsistent numbers of samples"):
            self.make_estimator().fit(X, y[:-1])

    def test_rejects_single_class(self, monkeypatch: pytest.MonkeyPatch) -> None:
        X, y = self.data()
        self._forbid_training(monkeypatch)
        with pytest.raises(InputError, match="at least two classes"):
            self.make_estimator().fit(X, np.zeros_like(y))

    def test_rejects_wrong_feature_count_at_predict(self) -> None:
        X, y = self.data()
        est = self.make_estimator().fit(X, y)
        with pytest.raises(InputError, match="features"):
            est.predict_proba(np.hstack([X, X[:, :1]]))
        with pytest.raises(InputError, match="features"):
            est.predict(X[:, :1])

    def test_rejects_unsupported_settings(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Multi-class data on a binary-only method, ``M`` on a method without inducing points."""
        cls = self.method_class()
        self._forbid_training(monkeypatch)
        if not cls.multiclass:
            X3, y3 = self.data(n_classes=3)
            with pytest.raises(InputError, match="binary"):
                self.make_estimator().fit(X3, y3)
        if not cls.uses_inducing_points:
            X, y = self.data()
            with pytest.raises(InputError, match="no inducing points"):
                self.make_estimator(M=5).fit(X, y)

    def test_objective_gradient(self) -> None:
        X, y = self.data()
        value, gradient, theta0 = self.objective_and_gradient(X, y)
        theta0 = np.asarray(theta0, dtype=np.float64)
        assert np.isfinite(value(theta0.copy())), "objective is not finite at theta0"
        assert_gradient_close(
            value,
            gradient(theta0.copy()),
            theta0,
            eps=self.gradient_eps,
            rtol=self.gradient_rtol,
            atol=self.gradient_atol,
            name=f"{self.method_name} objective gradient",
        )
