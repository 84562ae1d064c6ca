"""The fitted model without pickle: ``model_skops/model.skops`` is the run's deployable model
(the pipeline on raw features) and loads back with the MLflow model's probabilities, and a file
naming foreign types is refused unless they are trusted."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.experiment.runner import run_experiment
from gpinfer.experiment.safe_model import (
    DEPLOYABLE_TYPES,
    SKOPS_DIR,
    SKOPS_FILE,
    gpinfer_packages,
    load_skops,
    save_skops,
)

from .helpers import compose_cfg, load_logged_model, require_plugin

pytestmark = pytest.mark.usefixtures("toy_site")


class Foreign:
    """A class of neither gpinfer nor a plugin."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = value


def test_round_trip_gives_the_same_probabilities(tmp_path: Path) -> None:
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    import gpinfer

    require_plugin("laplace")
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:150]
    clf = gpinfer.GPClassifier(method="laplace", max_iter=3, random_state=0).fit(X, y[:150])
    path = save_skops(clf, tmp_path / "m.skops")
    assert b"cloudpickle" not in path.read_bytes()
    loaded = load_skops(path)
    assert type(loaded) is type(clf)
    assert np.array_equal(loaded.predict_proba(X), clf.predict_proba(X))
    assert {"gpinfer", "gpinfer_laplace"} <= gpinfer_packages()


def test_foreign_types_are_refused_unless_trusted(tmp_path: Path) -> None:
    path = save_skops({"model": Foreign(2.5)}, tmp_path / "f.skops")
    name = f"{Foreign.__module__}.Foreign"
    with pytest.raises(InputError, match=rf"names types that are neither gpinfer's nor "
                                         rf"trusted: {name}"):
        load_skops(path)
    assert load_skops(path, trusted=[name])["model"].value == 2.5
    (tmp_path / "bad.skops").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="is not a readable .skops file"):
        load_skops(tmp_path / "bad.skops")


def test_the_deployable_pipelines_types_are_trusted_and_foreign_steps_still_refused(
        tmp_path: Path) -> None:
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    assert {f"{c.__module__}.{c.__qualname__}"
            for c in (Pipeline, StandardScaler, TransformedTargetRegressor)} == DEPLOYABLE_TYPES
    X = np.random.default_rng(1).standard_normal((30, 3)) * 5 + 2
    pipe = Pipeline([("standardize", StandardScaler().fit(X)), ("model", "passthrough")])
    assert np.array_equal(load_skops(save_skops(pipe, tmp_path / "p.skops")).transform(X),
                          pipe.transform(X))
    foreign = Pipeline([("standardize", StandardScaler().fit(X)), ("model", Foreign())])
    with pytest.raises(InputError, match=f"{Foreign.__module__}.Foreign"):
        load_skops(save_skops(foreign, tmp_path / "f.skops"))


def test_a_run_logs_the_skops_model_next_to_the_pickled_one(tmp_path: Path,
                                                            store_uri: str) -> None:
    from mlflow.artifacts import download_artifacts
    from sklearn.datasets import load_breast_cancer

    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "mlflow.experiment=skops",
                      "method.name=toysparse", "method.likelihood=null", "M=5",
                      "iterations=3", "mlflow.log_model=true")
    result = run_experiment(cfg, output_dir=tmp_path / "run", stream=io.StringIO())
    run_id = result["mlflow_run_id"]
    local = download_artifacts(run_id=run_id, artifact_path=f"{SKOPS_DIR}/{SKOPS_FILE}",
                               tracking_uri=store_uri, dst_path=str(tmp_path / "dl"))
    safe = load_skops(local)  # the deployable pipeline: standardise, then the classifier
    pickled, _ = load_logged_model(run_id, store_uri)
    assert [name for name, _ in safe.steps] == [name for name, _ in pickled.steps]
    assert type(safe.steps[-1][1]) is type(pickled.steps[-1][1])
    raw = load_breast_cancer().data[:20]  # raw features, as the MLflow model takes them
    assert raw.shape[1] == result["n_features"]
    assert np.array_equal(safe.predict_proba(raw), pickled.predict_proba(raw))
    X = np.random.default_rng(0).standard_normal((20, result["n_features"]))
    assert np.array_equal(safe.predict_proba(X), pickled.predict_proba(X))


def test_skops_is_imported_without_torch_or_pytest_and_trusts_the_same_types() -> None:
    """``import_skops_io`` in a fresh interpreter leaves PyTorch and pytest unimported, and
    skops' list of trusted scikit-learn types is the one a plain import makes (oracle)."""
    import subprocess
    import sys

    probe = ("import sys; {imp}; from skops.io import _trusted_types as t; "
             "print(sorted(t.SKLEARN_ESTIMATOR_TYPE_NAMES)); "
             "print('torch' in sys.modules, 'pytest' in sys.modules)")
    ours = subprocess.run(
        [sys.executable, "-c", probe.format(
            imp="from gpinfer.experiment.safe_model import import_skops_io; import_skops_io()")],
        capture_output=True, text=True, check=True).stdout.splitlines()
    plain = subprocess.run([sys.executable, "-c", probe.format(imp="import skops.io")],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert ours[1] == "False False"
    assert ours[0] == plain[0] and len(ours[0]) > 1000  # some 200 names
