"""Input validation done by the core before any training starts.

Every check raises ``gpinfer.errors.InputError`` (a ``ValueError``) with a message that names
the offending array or option and, where one exists, the fix. Shapes follow the glossary:
``X [N, D]`` inputs, ``y [N]`` labels, ``Z [M, D]`` inducing inputs, ``C`` classes.

The registry is imported inside the functions that need it: it is resolved at call time (so a
test or a plugin may substitute ``gpinfer.registry.load_method``) and importing this module stays
cheap.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from gpinfer.errors import InputError

if TYPE_CHECKING:
    from gpinfer.backend.choice import Backend
    from gpinfer.interfaces import Likelihood, Method

Array = np.ndarray

__all__ = [
    "check_X",
    "check_X_y",
    "check_features_vary",
    "check_inducing",
    "check_method_compatible",
    "check_process_group",
    "check_sample_weight",
    "check_targets",
    "check_weight_support",
    "encode_labels",
    "feature_names",
    "host_input",
    "tensor_device",
]


def _is_sparse(obj: Any) -> bool:
    try:
        from scipy import sparse
    except ImportError:  # pragma: no cover - scipy is a hard dependency
        return False
    return sparse.issparse(obj)


def tensor_device(x: Any) -> str | None:
    """The device of ``x`` (``"cpu"``, ``"cuda:0"``) when it is a torch tensor, else ``None``.

    Told by the type's name and module, so torch is never imported for a check.
    """
    for cls in type(x).__mro__:
        if cls.__name__ == "Tensor" and cls.__module__.split(".")[0] == "torch":
            return str(getattr(x, "device", "cpu"))
    return None


def host_input(x: Any, name: str, method: str | None = None,
               backends: tuple[str, ...] = ("numpy", "torch")) -> Any:
    """``x`` itself, or, when it is a torch tensor, a host numpy copy of it.

    Training data stay in host memory (a method on the torch backend streams batches to its
    device), so a tensor is brought back to the host (``x.detach().cpu().numpy()``). For a
    ``method`` whose ``backends`` lack ``"torch"`` a tensor is an ``InputError`` naming the fix.
    """
    device = tensor_device(x)
    if device is None:
        return x
    if method is not None and "torch" not in backends:
        raise InputError(
            f"{name} is a torch tensor on {device} but method {method!r} runs on numpy only: "
            f"pass {name}.detach().cpu().numpy(), or use one of the methods with a torch "
            f"backend: {_alternatives(lambda m: 'torch' in tuple(m.backends))}"
        )
    t = x.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16
        t = t.float()
    return t.numpy()


def check_X(X: Any, name: str = "X") -> Array:
    """Validate an input matrix and return a float64 copy ``[N, D]`` (C-contiguous).

    Rejects (with ``InputError``) ``None``, sparse matrices, non-numeric or complex values,
    arrays that are not 2-D, arrays with no rows or no columns, and NaN/inf entries (the message
    gives their count and the first bad row and column). A value that NumPy cannot turn into a
    number at all (a dict, say) raises ``TypeError``, as ``float()`` does. The copy means a
    method can never modify the caller's array.
    """
    if X is None:
        raise InputError(f"{name} is None; expected an array of shape [N, D]")
    if _is_sparse(X):
        raise InputError(
            f"{name} is a sparse matrix; sparse input is not supported, pass a dense array "
            f"(e.g. {name}.toarray())"
        )
    raw = np.asarray(X)
    if np.iscomplexobj(raw):
        raise InputError(f"{name}: Complex data not supported; pass real-valued inputs")
    try:
        arr = np.array(raw, dtype=np.float64, order="C", copy=True)
    except TypeError as exc:
        raise TypeError(f"{name} must hold numbers only: {exc}") from exc
    except ValueError as exc:
        raise InputError(f"{name} must hold numbers only ({exc})") from exc
    if arr.ndim != 2:
        hint = (
            f". Reshape your data with {name}.reshape(-1, 1) if it has a single feature or "
            f"{name}.reshape(1, -1) if it is a single sample"
            if arr.ndim == 1
            else ""
        )
        raise InputError(f"{name} must be a 2-D array [N, D]; got shape {arr.shape}{hint}")
    n, d = arr.shape
    if n == 0:
        raise InputError(
            f"{name} has 0 sample(s) (shape={arr.shape}) while a minimum of 1 is required."
        )
    if d == 0:
        raise InputError(
            f"{name} has 0 feature(s) (shape={arr.shape}) while a minimum of 1 is required."
        )
    finite = np.isfinite(arr)
    if not finite.all():
        n_nan = int(np.isnan(arr).sum())
        n_inf = int(np.isinf(arr).sum())
        bad_rows = np.flatnonzero(~finite.all(axis=1))
        row = int(bad_rows[0])
        col = int(np.flatnonzero(~finite[row])[0])
        raise InputError(
            f"{name} contains {n_nan} NaN and {n_inf} inf value(s) in {len(bad_rows)} row(s); "
            f"first at row {row}, column {col} ({arr[row, col]}). Remove or impute them first."
        )
    return arr


def feature_names(X: Any) -> Array | None:
    """The column names of a DataFrame ``X`` as an object array ``[D]``; ``None`` for any other
    input (arrays, lists, tensors).

    ``InputError`` for names that are not all strings or that repeat (scikit-learn's
    ``feature_names_in_`` needs unique string names), naming the fix. The positions
    ``0..D-1`` that pandas gives a DataFrame built from an array (``pd.DataFrame(X)``) are no
    names: ``None``, as scikit-learn does.
    """
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = list(columns)
    if all(isinstance(name, numbers.Integral) for name in names) and names == list(
        range(len(names))
    ):
        return None
    not_str = [name for name in names if not isinstance(name, str)]
    if not_str:
        kinds = sorted({type(name).__name__ for name in not_str})
        raise InputError(
            f"X is a DataFrame whose column names are not all strings ({len(not_str)} of type "
            f"{', '.join(kinds)}, e.g. {not_str[0]!r}); name every column with a string, e.g. "
            "X.columns = X.columns.astype(str), or pass X.to_numpy()"
        )
    unique, counts = np.unique(np.asarray(names, dtype=object), return_counts=True)
    repeated = unique[counts > 1].tolist()
    if repeated:
        raise InputError(
            f"X is a DataFrame with duplicate column names {repeated}; column names must be "
            "unique (rename them, or pass X.to_numpy())"
        )
    return np.asarray(names, dtype=object)


def check_sample_weight(sample_weight: Any, n: int) -> Array | None:
    """Per-row weights ``[N]`` as float64 (a number: the same weight for every row); ``None``
    stays ``None``.

    ``InputError`` for a weight vector of another length or shape, non-numeric, NaN/inf or
    negative weights, and weights that are all zero.
    """
    if sample_weight is None:
        return None
    try:
        w = np.array(sample_weight, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise InputError(f"sample_weight must hold numbers only ({exc})") from exc
    if w.ndim == 0:
        w = np.full(n, float(w))
    if w.shape != (n,):
        raise InputError(
            f"sample_weight must have one weight per row of X, shape ({n},); got shape {w.shape}"
        )
    bad = ~np.isfinite(w)
    if bad.any():
        raise InputError(f"sample_weight contains {int(bad.sum())} NaN/inf value(s); first at "
                         f"index {int(np.flatnonzero(bad)[0])}")
    if (w < 0).any():
        first = int(np.flatnonzero(w < 0)[0])
        raise InputError(f"sample_weight must be non-negative; got {int((w < 0).sum())} "
                         f"negative weight(s), first {w[first]!r} at index {first}")
    if not (w > 0).any():
        raise InputError("sample_weight is zero for every row; at least one row needs a "
                         "positive weight")
    return w


def _labels_1d(y: Any) -> Array:
    """``y`` as a 1-D array ``[N]``; a column vector ``[N, 1]`` is flattened with a warning."""
    if y is None:
        raise InputError(
            "the classifier requires y to be passed, but the target y is None; "
            "pass one label per row of X"
        )
    if _is_sparse(y):
        raise InputError("y is a sparse matrix; sparse targets are not supported")
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        from sklearn.exceptions import DataConversionWarning

        warnings.warn(
            "A column-vector y was passed when a 1d array was expected; flattening it to [N].",
            DataConversionWarning,
            stacklevel=3,
        )
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise InputError(f"y should be a 1d array of labels [N]; got shape {arr.shape}")
    return arr


def check_X_y(X: Any, y: Any) -> tuple[Array, Array]:
    """Validate inputs and labels together: ``X [N, D]`` float64 (see ``check_X``), ``y [N]``.

    ``y`` is returned as a 1-D array with its own dtype (labels are encoded by ``encode_labels``).
    Raises ``InputError`` when the lengths differ.
    """
    X = check_X(X, "X")
    y = _labels_1d(y)
    if y.shape[0] != X.shape[0]:
        raise InputError(
            f"X and y have inconsistent numbers of samples: X has {X.shape[0]} rows, "
            f"y has {y.shape[0]} labels"
        )
    return X, y


def check_features_vary(minimum: Array, maximum: Array, n: int, name: str = "X") -> None:
    """``InputError`` when every feature of an input matrix ``X [N, D]`` of ``n >= 2`` rows is
    constant, told by its column minima and maxima ``[D]``.

    Every kernel reads the inputs only through the rows' values (a ``White`` term reads none
    and predicts nothing at new inputs for any ``X``), so such rows are one point to it: the
    model can only learn a constant, and the fit guard would refuse it after training. A
    constant feature beside one that varies is fine (as in scikit-learn and GPflow).
    """
    if n < 2 or bool(np.any(np.asarray(minimum) != np.asarray(maximum))):
        return
    d = int(np.size(minimum))
    raise InputError(
        f"{name}: every one of its {d} feature(s) is constant over its {n} rows (each column "
        "holds a single value), so the kernel sees all the rows as one point and no model can "
        "tell them apart; at least one feature must vary (a constant feature beside varying "
        "ones is fine): check the data and the columns selected"
    )


def _non_finite_entries(values: Array, noun: str) -> str:
    """What is not finite in the float vector ``values [N]``, as ``"a NaN and b inf
    <noun>(s); first at index i"``; ``""`` when every entry is finite."""
    bad = ~np.isfinite(values)
    if not bad.any():
        return ""
    return (f"{int(np.isnan(values).sum())} NaN and {int(np.isinf(values).sum())} inf "
            f"{noun}(s); first at index {int(np.flatnonzero(bad)[0])}")


def check_targets(y: Any) -> Array:
    """Real regression targets ``y [N]`` as float64; ``InputError`` for NaN/inf or non-numbers."""
    try:
        arr = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"regression targets y must be real numbers ({exc})") from exc
    non_finite = _non_finite_entries(arr, "value")
    if non_finite:
        raise InputError(f"regression targets y contain {non_finite}")
    return arr


def _check_label_values(y: Array) -> Array:
    """Reject NaN/inf, complex and continuous labels; returns ``y`` ready for ``np.unique``."""
    if np.iscomplexobj(y):
        raise InputError("y: Complex data not supported; pass class labels")
    if y.dtype == object:
        is_real = np.array(
            [isinstance(v, numbers.Real) and not isinstance(v, bool) for v in y], dtype=bool
        )
        if is_real.all() and y.size:
            y = y.astype(np.float64)
        elif is_real.any():
            values = y[is_real].astype(np.float64)
            if not np.isfinite(values).all():
                raise InputError(
                    f"y contains {int((~np.isfinite(values)).sum())} NaN/inf label(s); "
                    "every point needs a class label"
                )
    if y.dtype.kind == "f":
        non_finite = _non_finite_entries(y, "label")
        if non_finite:
            raise InputError(f"y contains {non_finite}. Every point needs a class label")
        fractional = y != np.round(y)
        if fractional.any():
            raise InputError(
                f"Unknown label type: continuous (y holds non-integer values such as "
                f"{y[fractional][0]!r}); a classifier needs class labels, not regression targets"
            )
    return y


def encode_labels(y: Any) -> tuple[Array, Array]:
    """Encode labels of any type as class indices.

    ``y [N]``: labels (ints, strings, integral floats, bools, objects that sort). Returns
    ``(classes_ [C], y_index [N])`` with ``classes_`` sorted (``np.unique``) and ``y_index``
    in ``0..C-1`` such that ``classes_[y_index]`` equals ``y``: int64, or for integer labels
    longer than ``LABEL_CHUNK`` the narrowest signed type that holds ``C - 1``
    (``_encode_integer_labels``; the likelihoods cast each batch's labels to int64). Raises
    ``InputError`` for NaN/inf or continuous labels, mixed label types, and fewer than two
    classes.
    """
    y = _labels_1d(y)
    if y.dtype.kind in "iub" and y.shape[0] > LABEL_CHUNK:
        return _two_classes(*_encode_integer_labels(y))
    original = y
    y = _check_label_values(y)
    try:
        _, first, index = np.unique(y, return_index=True, return_inverse=True)
    except TypeError as exc:
        kinds = sorted({type(v).__name__ for v in y.tolist()})
        raise InputError(
            f"y mixes label types ({', '.join(kinds)}) that cannot be sorted; use one type"
        ) from exc
    # classes_ keep the caller's label type (an object array of ints stays ints, and so on)
    return _two_classes(original[first], np.asarray(index, dtype=np.int64).reshape(-1))


#: integer labels longer than this are encoded in chunks (``_encode_integer_labels``)
LABEL_CHUNK = 1 << 20


def _encode_integer_labels(y: Array) -> tuple[Array, Array]:
    """``encode_labels`` of integer or bool labels ``y [N]`` with memory ``O(N)`` for the
    indices only, in the narrowest signed type that holds ``C - 1`` (int8 up to 128 classes:
    10 MB at ``N = 1e7`` instead of int64's 80): the classes are the union of each chunk's
    ``np.unique`` and the indices ``np.searchsorted`` of each chunk (equal to ``np.unique``'s,
    whose whole-array sort needs several ``[N]`` temporaries: 400 MB at ``N = 1e7``)."""
    classes = np.unique(y[:LABEL_CHUNK])
    for lo in range(LABEL_CHUNK, y.shape[0], LABEL_CHUNK):
        classes = np.union1d(classes, np.unique(y[lo:lo + LABEL_CHUNK])).astype(y.dtype)
    index = np.empty(y.shape[0], dtype=np.promote_types(np.int8,
                                                        np.min_scalar_type(-len(classes))))
    for lo in range(0, y.shape[0], LABEL_CHUNK):
        index[lo:lo + LABEL_CHUNK] = np.searchsorted(classes, y[lo:lo + LABEL_CHUNK])
    return classes, index


def class_counts(y_index: Array, n_classes: int) -> Array:
    """How many of the class indices ``y_index [N]`` (ints in ``0..n_classes-1``) fall in each
    class: ``[n_classes]`` int64, by ``np.bincount`` over chunks of ``LABEL_CHUNK`` (its cast to
    ``intp`` then copies one chunk, not all of ``y_index``)."""
    counts = np.zeros(n_classes, dtype=np.int64)
    for lo in range(0, y_index.shape[0], LABEL_CHUNK):
        counts += np.bincount(y_index[lo:lo + LABEL_CHUNK], minlength=n_classes)
    return counts


def _two_classes(classes: Array, index: Array) -> tuple[Array, Array]:
    """``(classes, index)`` when there are at least two classes; else ``InputError``."""
    if len(classes) < 2:
        found = f"1 class ({classes.tolist()[0]!r})" if len(classes) == 1 else "no labels"
        raise InputError(f"y has {found}; classification needs at least two classes")
    return classes, index


def check_inducing(
    M: Any, n: int, d: int, method_name: str, uses_inducing_points: bool
) -> int | Array | None:
    """Validate the inducing-point setting ``M`` for ``n`` points in ``d`` dimensions.

    * ``None``: the method's default (or no inducing points) -> ``None``.
    * ``int`` count ``1..N`` -> that count.
    * ``float`` fraction in ``(0, 1]`` -> ``max(1, round(M * N))``.
    * array ``[M, D]`` of initial inducing inputs (finite, ``1 <= M <= N`` rows, ``D == d``)
      -> a float64 copy.

    ``M <= 0``, ``M > N`` and anything else raise ``InputError``, as does a non-null ``M`` for a
    method without inducing points ("method X has no inducing points; leave M unset").
    """
    if M is None:
        return None
    if not uses_inducing_points:
        raise InputError(
            f"method {method_name!r} has no inducing points; leave M unset (got M={M!r})"
        )
    if isinstance(M, bool | np.bool_) or isinstance(M, str):
        raise InputError(
            f"M must be a count of inducing points (int), a fraction of N in (0, 1] (float) "
            f"or an array [M, D] of inducing inputs; got {M!r}"
        )
    if isinstance(M, numbers.Integral):
        count = int(M)
        if count <= 0:
            raise InputError(
                f"M must be a positive number of inducing points (a count 1..N or a fraction "
                f"in (0, 1]); got M={count}"
            )
        if count > n:
            raise InputError(
                f"M={count} inducing points exceeds the number of training points N={n}; "
                f"use M <= {n} or a fraction such as 0.1"
            )
        return count
    if isinstance(M, numbers.Real):
        frac = float(M)
        if not (0.0 < frac <= 1.0):
            raise InputError(
                f"a float M is a fraction of N in (0, 1]; got M={frac!r}"
                + (" (pass an int for a count of inducing points)" if frac > 1 else "")
            )
        return max(1, int(round(frac * n)))
    Z = check_X(M, name="M (inducing inputs)")
    if Z.shape[1] != d:
        raise InputError(
            f"inducing inputs M have {Z.shape[1]} column(s) but X has {d} feature(s); "
            "pass an array [M, D] with the same D"
        )
    if Z.shape[0] > n:
        raise InputError(f"{Z.shape[0]} inducing inputs exceed the number of training points N={n}")
    return Z


def _alternatives(predicate: Callable[[type[Method]], bool]) -> str:
    """Comma-separated names of installed methods satisfying ``predicate`` (or a note)."""
    from gpinfer import registry

    names = list(registry.methods_supporting(predicate))
    return ", ".join(names) if names else "(none installed)"


def check_binary_labels(
    y: Any, n_classes: int, method: str, *, require_both: bool = False
) -> Array:
    """Class indices ``[N]`` (int64) of a binary problem, for methods that handle two classes.

    Raises ``InputError`` naming the installed multi-class methods when ``y`` is not 0/1 or the
    problem has more than two classes; with ``require_both`` both classes must be present.
    """
    y = np.asarray(y)
    values = np.unique(y)
    ok = y.ndim == 1 and n_classes <= 2 and bool(np.all(np.isin(values, [0, 1])))
    if not ok:
        raise InputError(
            f"{method} handles binary classification with labels 0/1 only; got "
            f"n_classes={n_classes} and label values {values[:10].tolist()}. "
            f"Multi-class methods: {_alternatives(lambda m: m.multiclass)}"
        )
    if require_both and len(values) < 2:
        raise InputError(
            f"{method} needs both classes 0/1 present in y (binary classification); "
            f"got only {values.tolist()}"
        )
    return y.astype(np.int64)


def check_method_compatible(
    method_cls: type[Method],
    n_classes: int,
    task: str,
    batch_size: int | None,
    likelihood_name: str | None,
    *,
    likelihood: Likelihood | None = None,
    backend: Backend | None = None,
    options: Mapping[str, Any] | None = None,
) -> None:
    """Check a problem against what ``method_cls`` declares, before training (the estimators'
    ``fit``; ``gpinfer-run`` before its MLflow run exists).

    Checks, in order: the process group (``check_process_group``), the task (``"classification"`` /
    ``"regression"``), the number of classes ``C`` (more than two needs ``method_cls.multiclass``),
    ``batch_size`` (a positive int, and only for methods with ``supports_minibatch``),
    ``likelihood_name`` (``None`` skips this; otherwise it must be in ``method_cls.likelihoods``, or
    ``likelihood``, the object of that name, must have every capability of
    ``method_cls.likelihood_requirements``: a third party's likelihood), then, with a resolved
    ``backend``, the method on it (``Method.backends``, ``Method.float32``) and the likelihood's
    expectation rule on it, for methods whose training evaluates one
    (``Method.expectation_likelihood`` with the method ``options``;
    ``Likelihood.supported_backends``). The likelihood is ``likelihood``, else the one named
    ``likelihood_name``, else the method's default for ``C`` classes. Each ``InputError`` names what
    would handle the problem: the installed methods (``registry.methods_supporting``) and, for a
    rule, the likelihood's rules that run on the backend and the method's likelihoods whose default
    rule does.
    """
    name = method_cls.name or method_cls.__name__
    check_process_group(method_cls, name)
    _check_task(method_cls, name, task, n_classes)
    if batch_size is not None:
        _check_batch_size(method_cls, name, batch_size)
    _check_likelihood(method_cls, name, task, likelihood_name, likelihood)
    if backend is not None:
        check_method_backend(method_cls, name, backend)
    if backend is not None and not backend.is_numpy:  # numpy runs every expectation rule
        lik = likelihood if likelihood is not None else _named_likelihood(
            method_cls, likelihood_name, n_classes)
        if lik is not None:
            evaluated = method_cls.expectation_likelihood(lik, options or {})
            _check_rule_backend(method_cls, name, backend, n_classes, evaluated,
                                evaluated is not None and evaluated.expectation != lik.expectation)


def _check_task(method_cls: type[Method], name: str, task: str, n_classes: int) -> None:
    """``InputError`` unless ``method_cls`` handles ``task`` and, for classification, ``C =
    n_classes`` classes (more than two needs ``multiclass``)."""
    tasks = (method_cls.tasks,) if isinstance(method_cls.tasks, str) else tuple(method_cls.tasks)
    if task not in tasks:
        alts = _alternatives(lambda m: task in _tasks_of(m))
        raise InputError(
            f"method {name!r} handles {' and '.join(tasks) or 'no'} problems, not {task}; "
            f"for {task} use one of: {alts}"
        )
    if task == "classification" and n_classes > 2 and not method_cls.multiclass:
        alts = _alternatives(lambda m: "classification" in _tasks_of(m) and bool(m.multiclass))
        raise InputError(
            f"method {name!r} handles binary problems only (Only binary classification is "
            f"supported by {name!r}), but y has {n_classes} classes; for {n_classes} classes "
            f"use one of: {alts}"
        )


def _check_batch_size(method_cls: type[Method], name: str, batch_size: object) -> None:
    """``InputError`` unless ``batch_size`` is a positive int and ``method_cls`` trains on
    mini-batches."""
    if (
        isinstance(batch_size, bool | np.bool_)
        or not isinstance(batch_size, numbers.Integral)
        or batch_size < 1
    ):
        raise InputError(f"batch_size must be a positive int or None; got {batch_size!r}")
    if not method_cls.supports_minibatch:
        alts = _alternatives(lambda m: bool(m.supports_minibatch))
        raise InputError(
            f"method {name!r} does not train on mini-batches; leave batch_size unset, or "
            f"for mini-batch training use one of: {alts}"
        )


def _check_likelihood(method_cls: type[Method], name: str, task: str,
                      likelihood_name: str | None, likelihood: Likelihood | None) -> None:
    """``InputError`` unless ``likelihood_name`` is one of ``method_cls.likelihoods`` or
    ``likelihood`` (a third party's) has every capability the method requires; ``None`` for
    ``likelihood_name`` skips the name check."""
    requirements = method_cls.likelihood_requirements
    named = likelihood_name is not None and likelihood_name in tuple(method_cls.likelihoods)
    if likelihood is not None and requirements is not None and not named:
        if likelihood.supports(requirements) and likelihood.task == task:
            return  # a third party's likelihood with every capability the method needs
        missing = sorted(set(requirements) - likelihood.capabilities)
        raise InputError(
            f"method {name!r} needs a {task} likelihood with the capabilities "
            f"{sorted(requirements)}; {type(likelihood).__name__} ({likelihood_name!r}) "
            f"lacks {missing or 'the task'} (docs/glossary.md, capabilities)"
        )
    if likelihood_name is not None and likelihood_name not in tuple(method_cls.likelihoods):
        accepted = ", ".join(method_cls.likelihoods) or "none"
        alts = _alternatives(lambda m: likelihood_name in tuple(m.likelihoods))
        raise InputError(
            f"method {name!r} does not accept likelihood {likelihood_name!r} (it accepts: "
            f"{accepted}); for {likelihood_name!r} use one of: {alts}"
        )


def check_process_group(method_cls: type[Method], name: str) -> None:
    """``InputError`` when a ``torch.distributed`` process group of more than one rank is
    active (``gpinfer.training.distributed.current``) and ``method_cls`` does not train in
    one (``Method.supports_process_group``), naming the installed methods that do. Part of
    ``check_method_compatible``; ``gpinfer-run`` also calls it alone, as soon as the group is
    started (before its store is opened and its data are loaded)."""
    from gpinfer.training import distributed

    group = distributed.current()
    if group is None or getattr(method_cls, "supports_process_group", False):
        return
    alts = _alternatives(lambda m: bool(getattr(m, "supports_process_group", False)))
    raise InputError(
        f"method {name!r} does not train data-parallel, but a process group of {group.size} "
        f"ranks is active (torch.distributed, e.g. torchrun): every rank would fit the whole "
        f"model alone; use one of the methods that train in a process group: {alts}; or run "
        f"{name!r} in one process")


def check_method_backend(method_cls: type[Method], name: str, backend: Backend) -> None:
    """``InputError`` unless ``method_cls`` runs on ``backend`` (``Method.backends``) in its
    dtype (float32 needs ``Method.float32``), naming the installed methods that do. Part of
    ``check_method_compatible``; ``gpinfer-run`` also calls it alone, before its store is
    opened and its data are loaded (the rule's check needs the class count)."""
    supported = tuple(method_cls.backends)
    if backend.name not in supported:
        alts = _alternatives(lambda m: backend.name in tuple(m.backends))
        raise InputError(
            f"method {name!r} runs on {' and '.join(supported)} only (backend="
            f"{backend.name!r}, device={backend.device!r} asked for): leave backend and device "
            f"unset, or use one of the methods with a {backend.name} backend: {alts}")
    if backend.dtype == "float32" and not method_cls.float32:
        alts = _alternatives(lambda m: backend.name in tuple(m.backends) and bool(m.float32))
        raise InputError(f"method {name!r} needs dtype='float64': {method_cls.float64_reason}; "
                         f"methods that run in float32 on {backend.name}: {alts}")


def _named_likelihood(method_cls: type[Method], likelihood_name: str | None, n_classes: int
                      ) -> Likelihood | None:
    """The likelihood named ``likelihood_name``, else the method's default for ``n_classes``
    classes (None: it declares none)."""
    from gpinfer.likelihoods import default_likelihood, make_likelihood

    if likelihood_name is not None:
        return make_likelihood(likelihood_name)
    return default_likelihood(method_cls.likelihoods, n_classes)


def _check_rule_backend(method_cls: type[Method], name: str, backend: Backend, n_classes: int,
                        likelihood: Likelihood | None, set_by_options: bool) -> None:
    """``InputError`` unless the expectation rule of ``likelihood`` (the one ``method_cls``
    trains with, its rule set by the method's options when ``set_by_options``; None: it
    evaluates none) runs on ``backend`` for ``n_classes`` classes. The message names the rule,
    the backend, the likelihood's rules that run there and the method's likelihoods whose
    default rule does."""
    if likelihood is None:
        return
    classes = n_classes if likelihood.multiclass else None
    try:
        likelihood.require_backend(backend.name, classes)
    except InputError as err:
        from gpinfer.likelihoods import make_likelihood

        alts = [lik_name for lik_name in method_cls.likelihoods
                if lik_name != likelihood.name and _default_rule_runs(
                    make_likelihood(lik_name), backend.name, n_classes)]
        more = (f"; or a likelihood of {name} whose default rule runs there: "
                f"{', '.join(alts)}" if alts else "")
        whose = f"the rule {name}'s options set" if set_by_options else "its likelihood's rule"
        raise InputError(f"method {name!r} evaluates {whose} on the {backend.name} backend, "
                         f"and {err}{more}") from None


def _default_rule_runs(likelihood: Likelihood, backend: str, n_classes: int) -> bool:
    """Whether ``likelihood`` (at its default rule) suits ``n_classes`` classes and runs on
    ``backend``."""
    if n_classes > 2 and not likelihood.multiclass:
        return False
    return backend in likelihood.supported_backends(
        n_classes=n_classes if likelihood.multiclass else None)


def check_weight_support(method_cls: type[Method], method_name: str | None = None) -> None:
    """``InputError`` naming the installed methods that take per-point weights unless
    ``method_cls`` declares ``supports_sample_weight``."""
    if getattr(method_cls, "supports_sample_weight", False):
        return
    name = method_name or method_cls.name or method_cls.__name__
    alts = _alternatives(lambda m: bool(getattr(m, "supports_sample_weight", False)))
    raise InputError(
        f"method {name!r} does not take sample_weight (only weights of 0 and 1, which drop or "
        f"keep rows): its objective is not a weighted sum over points; for weighted points "
        f"use one of: {alts}"
    )


def _tasks_of(method_cls: type[Method]) -> tuple[str, ...]:
    tasks = method_cls.tasks
    return (tasks,) if isinstance(tasks, str) else tuple(tasks)
