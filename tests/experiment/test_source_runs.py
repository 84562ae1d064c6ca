"""``gpinfer-run dataset=file`` on data read out of core (``dataset.format=npy|parquet``): a
memmapped ``.npy`` file, ``.npy`` shards (a glob, a folder) and Parquet give the metrics of the
run of the same rows loaded into memory (an ``.npz``), their MLflow runs end FINISHED with the
dataset inputs logged (the in-memory run's digest, the full shape); a method that cannot stream
and a bad layout are refused before any MLflow run exists; more ranks than shards is an
``InputError``."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.experiment.runner import run_experiment

from .helpers import REPO, store_cfg

N, D = 480, 3
#: sep in mini-batches on a few iterations: a fit of a second or less
RUN = ("method=sep", "method.likelihood=null", "M=8", "batch_size=96", "iterations=4",
       "eval_every=2", "dataset=file", "mlflow.log_datasets=true")
COMPARED = ("test_error", "test_nll", "log_evidence", "n_iter", "n_train", "n_test")


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three float32 columns of different scales and 3 classes (labels 1, 4, 7 as stored)."""
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(N, D)) * [1.0, 4.0, 0.3] + [0.0, 3.0, -1.0]).astype(np.float32)
    score = X[:, 0] + 0.25 * X[:, 1] + 0.5 * rng.normal(size=N)
    y = np.array([1, 4, 7])[np.digitize(score, [0.2, 1.4])]
    return X, y


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same rows as an .npz (in memory), one .npy file, three shards, Parquet."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("source_runs")
    X, y = _data()
    np.savez(root / "data.npz", X=X, y=np.searchsorted([1, 4, 7], y))
    (root / "one").mkdir()
    np.save(root / "one" / "X.npy", X)
    np.save(root / "one" / "y.npy", y)
    (root / "shards").mkdir()
    for k, rows in enumerate(np.array_split(np.arange(N), 3)):
        np.save(root / "shards" / f"X_{k:03d}.npy", X[rows])
        np.save(root / "shards" / f"y_{k:03d}.npy", y[rows])
    table = pa.table({**{f"x{j}": X[:, j] for j in range(D)}, "label": y})
    pq.write_table(table, root / "data.parquet", row_group_size=100)
    return root


def _run(uri: str, out: Path, *overrides: str) -> dict:
    return run_experiment(store_cfg(uri, *RUN, *overrides), output_dir=out,
                          stream=io.StringIO())


def _runs(uri: str, experiment: str) -> list:
    """The runs of ``experiment`` in the store ``uri`` (none when it was never created)."""
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(uri).get_experiment_by_name(experiment)
    return [] if exp is None else MlflowClient(uri).search_runs([exp.experiment_id])


def _inputs(uri: str, run_id: str) -> dict[str, object]:
    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    return {i.dataset.name: i.dataset for i in run.inputs.dataset_inputs}


@pytest.mark.parametrize("layout", [
    ("one/X.npy",),
    ("shards/X_*.npy",),
    ("shards", "dataset.format=npy"),
    ("data.parquet", "dataset.labels=label"),
])
def test_a_run_out_of_core_equals_the_run_in_memory(files: Path, tmp_path: Path,
                                                    store_uri: str,
                                                    layout: tuple[str, ...]) -> None:
    uri, tag = store_uri, layout[0].replace("/", "-")  # one experiment each: MLflow keeps
    ref = _run(uri, tmp_path / "ref", f"dataset.path='{files / 'data.npz'}'",  # a dataset's
               f"mlflow.experiment=memory-{tag}")  # first profile per experiment
    got = _run(uri, tmp_path / "src", f"dataset.path='{files / layout[0]}'", *layout[1:],
               f"mlflow.experiment=source-{tag}")
    assert got["status"] == "FINISHED"
    assert {k: got[k] for k in COMPARED} == {k: ref[k] for k in COMPARED}
    assert (got["n_train"], got["n_test"]) == (N - N // 10, N // 10)
    mine, theirs = _inputs(uri, got["mlflow_run_id"]), _inputs(uri, ref["mlflow_run_id"])
    assert sorted(mine) == ["file-test", "file-train"]
    for name, dataset in mine.items():
        assert dataset.digest == theirs[name].digest  # type: ignore[attr-defined]
    import json

    profile = json.loads(mine["file-train"].profile)  # type: ignore[attr-defined]
    assert profile["features_shape"] == [N - N // 10, D]
    assert profile["features_stored_as"] == "float32"


@pytest.mark.parametrize("standardize", ["true", "false"])
def test_the_training_rows_are_checked_once(files: Path, tmp_path: Path, store_uri: str,
                                            monkeypatch: pytest.MonkeyPatch,
                                            standardize: str) -> None:
    """The runner's one chunked pass over the file hands its result to the estimator
    (``RowSource.checked``): the estimator reads no row to check them again (before the mend
    it scanned every training row a second time), and the run's numbers are those of a run
    whose estimator checks them itself."""
    from gpinfer import out_of_core
    from gpinfer.data.source import RowSource

    scans: list[str] = []
    real = out_of_core.scan

    def counted(source, *args, **kwargs):
        scans.append(source.describe())
        return real(source, *args, **kwargs)

    monkeypatch.setattr(out_of_core, "scan", counted)
    data = (f"dataset.path='{files / 'one' / 'X.npy'}'", f"dataset.standardize={standardize}",
            f"mlflow.experiment=once-{standardize}")
    got = _run(store_uri, tmp_path / "once", *data)
    assert scans == []
    # the estimator's own check, as before: its scan of the training rows
    monkeypatch.setattr(RowSource, "checked", property(lambda self: None,
                                                       lambda self, value: None))
    ref = _run(store_uri, tmp_path / "twice", *data)
    assert len(scans) == 1
    keys = (*COMPARED, "train_nll", "baseline_nll", "status")
    assert {k: got[k] for k in keys} == {k: ref[k] for k in keys}
    once, twice = (np.load(tmp_path / run / "state.npz") for run in ("once", "twice"))
    assert sorted(once.files) == sorted(twice.files)
    for key in once.files:  # the fitted state, bit for bit
        np.testing.assert_array_equal(once[key], twice[key], err_msg=key)


def test_the_files_own_test_part(files: Path, tmp_path: Path, store_uri: str) -> None:
    X, y = _data()
    index = np.searchsorted([1, 4, 7], y)
    np.savez(tmp_path / "parts.npz", X_train=X[:400], y_train=index[:400], X_test=X[400:],
             y_test=index[400:])
    for part, rows in (("train", slice(0, 400)), ("test", slice(400, N))):
        np.save(tmp_path / f"X_{part}.npy", X[rows])
        np.save(tmp_path / f"y_{part}.npy", y[rows])
    uri = store_uri
    own = ("dataset.test_fraction=null", "mlflow.log_datasets=false")
    ref = _run(uri, tmp_path / "ref", f"dataset.path='{tmp_path / 'parts.npz'}'", *own)
    got = _run(uri, tmp_path / "src", f"dataset.path='{tmp_path / 'X_train.npy'}'",
               f"dataset.test_path='{tmp_path / 'X_test.npy'}'", *own)
    assert {k: got[k] for k in COMPARED} == {k: ref[k] for k in COMPARED}
    assert (got["n_train"], got["n_test"]) == (400, N - 400)


@pytest.mark.parametrize("overrides, message", [
    (("method=laplace", "batch_size=null", "M=null"),
     r"method 'laplace' needs all of X in memory.*sep.*svi"),
    (("batch_size=null",), r"must train on mini-batches: set batch_size"),
    (("dataset.n_max=100",), r"dataset.n_max apply to files loaded into memory only"),
    (("dataset.test_fraction=null",), r"no test part of its own: set dataset.test_path"),
    (("dataset.labels=/nowhere/y.npy",), r"labels: '/nowhere/y.npy' not found"),
])
def test_refused_before_any_run(files: Path, tmp_path: Path, store_uri: str,
                                overrides: tuple[str, ...], message: str) -> None:
    experiment = f"refused-{tmp_path.name}"
    with pytest.raises(InputError, match=message):
        _run(store_uri, tmp_path / "out", f"dataset.path='{files / 'shards'}'",
             f"mlflow.experiment={experiment}", *overrides)
    assert _runs(store_uri, experiment) == []


def test_bad_files_are_named(files: Path, tmp_path: Path, store_uri: str) -> None:
    X, y = _data()
    X[N - 2, 1] = np.nan
    np.save(tmp_path / "X_a.npy", X[:200])
    np.save(tmp_path / "y_a.npy", y[:200])
    np.save(tmp_path / "X_b.npy", X[200:])
    np.save(tmp_path / "y_b.npy", y[200:])
    np.save(tmp_path / "X_c.npy", X[:10])
    uri = store_uri
    X_bad = ("mlflow.experiment=bad-files",)
    # the NaN in a test row is named by its row of the file (all the shards' rows)
    with pytest.raises(InputError, match=rf"first at row {N - 2}, column 1"):
        _run(uri, tmp_path / "a", f"dataset.path='{tmp_path}/X_[ab].npy'", *X_bad)
    with pytest.raises(InputError, match=r"expected '.*y_c.npy' beside it"):
        _run(uri, tmp_path / "b", f"dataset.path='{tmp_path}/X_*.npy'", *X_bad)
    with pytest.raises(InputError, match=r"hold 200 values but X has 480 rows"):
        _run(uri, tmp_path / "c", f"dataset.path='{tmp_path}/X_[ab].npy'",
             f"dataset.labels='{tmp_path}/y_a.npy'", *X_bad)
    with pytest.raises(InputError, match=r"dataset.labels applies to files read out of core"):
        _run(uri, tmp_path / "e", f"dataset.path='{files / 'data.npz'}'", "dataset.labels=y",
             *X_bad)
    with pytest.raises(InputError, match=r"no label column 'y'"):
        _run(uri, tmp_path / "d", f"dataset.path='{files / 'data.parquet'}'", *X_bad)
    assert _runs(uri, "bad-files") == []


def test_more_ranks_than_shards_is_refused(files: Path) -> None:
    from gpinfer.data.source import ArraySource, ShardSource
    from gpinfer.out_of_core import check_group_shards
    from gpinfer.training.distributed import Group

    shards = ShardSource(sorted((files / "shards").glob("X_*.npy")))
    for size in (2, 3):
        check_group_shards(shards, Group(0, size))
    check_group_shards(shards, None)
    with pytest.raises(InputError, match=r"started 4 ranks but X .* has 3 shard\(s\)"):
        check_group_shards(shards, Group(1, 4))
    check_group_shards(ArraySource(np.load(files / "one" / "X.npy", mmap_mode="r")),
                       Group(0, 4))  # one array: read by every rank, no shard count


def test_two_ranks_refuse_one_shard_and_fit_two(files: Path, tmp_path: Path,
                                                store_uri: str) -> None:
    """``torchrun --nproc-per-node 2``: ``GPClassifier.fit`` on one .npy shard raises the
    InputError before training; on two shards the run is rank 0's, FINISHED, with the metrics of
    one process (the ranks' parts of each global batch make the union batch); ``gpinfer-run`` on
    one .npy file raises the InputError on every rank before any MLflow run (last: a refused job
    ends the rank's part of the group, ``distributed.leave_on_failure``)."""
    pytest.importorskip("torch", reason="torch.distributed needs PyTorch")
    from gpinfer.testing.ranks import run_ranks

    X, y = _data()
    two = tmp_path / "two"
    two.mkdir()
    for k, rows in enumerate(np.array_split(np.arange(N), 2)):
        np.save(two / f"X_{k}.npy", X[rows])
        np.save(two / f"y_{k}.npy", y[rows])
    uri, run = store_uri, (*RUN, "mlflow.experiment=two-ranks", "mlflow.log_datasets=false")
    out = run_ranks(f"""
        from tests.experiment.helpers import store_cfg
        from gpinfer.errors import InputError
        from gpinfer.experiment.runner import run_experiment
        run = {run!r}
        from gpinfer import GPClassifier
        try:  # the estimator's own check, on a list of one shard (the group stays: every
            # rank makes it alike, before any collective)
            GPClassifier(method="sep", M=8, batch_size=96, max_iter=1).fit(
                [{str(files / 'one' / 'X.npy')!r}], np.load({str(files / 'one' / 'y.npy')!r}))
            fit_refused = ""
        except InputError as exc:
            fit_refused = str(exc)
        result = run_experiment(store_cfg({uri!r}, *run, "dataset.path={two}"),
                                output_dir={str(tmp_path)!r} + f"/two{{RANK}}")
        try:  # last: a refused gpinfer-run job ends this rank's part of the group
            run_experiment(store_cfg({uri!r}, *run, "dataset.path={files / 'one' / 'X.npy'}"),
                           output_dir={str(tmp_path)!r} + f"/one{{RANK}}")
            refused = ""
        except InputError as exc:
            refused = str(exc)
        save(refused=refused, fit_refused=fit_refused, status=result["status"],
             nll=result.get("test_nll", float("nan")))
    """, 2, tmp_path / "ranks", cwd=REPO)
    for rank in out:
        assert "torchrun started 2 ranks but X" in str(rank["refused"])
        assert "has 1 shard(s)" in str(rank["fit_refused"])
        assert str(rank["status"]) == "FINISHED"
    runs = _runs(uri, "two-ranks")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    alone = _run(uri, tmp_path / "alone", f"dataset.path='{two}'", "mlflow.experiment=alone")
    assert float(out[0]["nll"]) == pytest.approx(alone["test_nll"], rel=1e-10, abs=0)
