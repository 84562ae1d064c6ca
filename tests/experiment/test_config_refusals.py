"""Configurations that ``benchmarks/config_hunt.py`` found refused only inside their MLflow run
(s40): each is now refused before any MLflow run exists, with the key named."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from gpinfer.errors import InputError
from gpinfer.experiment.runner import run_experiment

from .helpers import compose_cfg, store_runs


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        # iris: 150 rows, test_fraction 0.1 -> 135 training rows
        (["method=svi", "dataset=iris", "batch_size=1000"],
         r"batch_size=1000 is larger than the 135 training rows a fit of 'svi' on dataset "
         r"'iris' trains on; use batch_size <= 135"),
        # 0.2 of 135 is a hold-out under 200 points: round(1 / 0.2) = 5 folds of 27 rows, each
        # fit on the other 108
        (["method=svi", "dataset=iris", "batch_size=130", "validation_fraction=0.2"],
         r"batch_size=130 is larger than the 108 training rows .*early stopping"),
        (["method=laplace", "dataset=breast_cancer", "validation_fraction=0.2",
          "validation_folds=1000"],
         r"validation_folds=1000 exceeds the 512 training points"),
        # a binary subset (keep_classes: 100 rows, 90 for training), the count after the
        # dataset's own filters
        (["method=laplace", "dataset=iris", "dataset.keep_classes=[0,1]",
          "validation_fraction=0.2", "validation_folds=100"],
         r"validation_folds=100 exceeds the 90 training points"),
    ],
    ids=["batch-over-N", "batch-over-fold-rows", "folds-over-N", "folds-over-N-binary-iris"],
)
def test_fit_rows_refused_before_any_mlflow_run(tmp_path, store_uri, overrides, pattern):
    before = len(store_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "iterations=2", *overrides)
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before  # no run, not even a FAILED one
    assert not (tmp_path / "run" / "result.json").exists()


@pytest.mark.parametrize("override, pattern", [
    ("mlflow.experiment=''", r"^mlflow.experiment must be the name of an MLflow experiment "
                             r"\(null: gpinfer\); got ''$"),
    ("mlflow.experiment='  '", r"^mlflow.experiment must be .*; got '  '$"),
    # a typo of a real key added with +: ran with iterations=2, the key ignored
    ("+iteration=5", r"^unknown configuration key iteration; did you mean iterations\? "
                     r"\(gpinfer-run reads the top-level keys .*: M, backend, .*iterations"),
    ("+mlflow.experimnt=x", r"^unknown configuration key mlflow.experimnt; did you mean "
                            r"mlflow.experiment\?"),
    ("+progess.bar=false", r"^unknown configuration key progess; did you mean progress\?"),
], ids=["experiment-empty", "experiment-blank", "top-level-typo", "mlflow-typo",
        "group-typo"])
def test_unknown_keys_and_an_empty_experiment_refused_before_any_mlflow_run(
        tmp_path, store_uri, override, pattern):
    before = len(store_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=laplace", "dataset=iris",
                      "dataset.keep_classes=[0,1]", "iterations=2", override)
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before
    assert not (tmp_path / "run").exists()


def test_every_protocol_of_gpinfer_run_composes_with_known_keys_only():
    # the protocols' own top-level keys (protocol, and the settings they override) are known
    from gpinfer.experiment.settings import config_to_dict, parse_settings

    for name in ("bui2017_classification", "izmailov2017", "seeger2004_mnist",
                 "villacampa2017_uci"):
        conf = config_to_dict(compose_cfg(f"+experiment={name}"))
        assert "protocol" in conf  # a top-level key the protocol adds, beside conf/config.yaml's
        settings = parse_settings(conf)
        assert settings.method == conf["method"]["name"]
        assert settings.dataset == conf["dataset"]["name"]
        # the same protocol with a key nobody declares is refused, naming it
        with pytest.raises(InputError, match="unknown configuration key protocoll"):
            parse_settings(config_to_dict(compose_cfg(f"+experiment={name}", "+protocoll=1")))


def test_all_constant_features_refused_before_any_mlflow_run(tmp_path, store_uri):
    # digits' pixels 0, 32 and 39 are 0 in every image: the kernel saw one point, and the run
    # ended FAILED with a FitFailedError after training
    before = len(store_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=laplace", "dataset=digits",
                      "dataset.keep_classes=[0,1]", "dataset.features=[0,32,39]",
                      "iterations=2")
    with pytest.raises(InputError, match=r"dataset 'digits'.s training inputs: every one of "
                                         r"its 3 feature\(s\) is constant"):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before


def test_binary_likelihood_on_multiclass_data_refused_before_any_mlflow_run(tmp_path, store_uri):
    # svi declares probit (for binary data); iris has three classes: the estimator refused it
    # only inside the run (a FAILED run), the runner now before it
    before = len(store_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=svi", "dataset=iris",
                      "method.likelihood=probit", "iterations=2")
    with pytest.raises(InputError, match=r"method.likelihood=probit is binary but dataset 'iris' "
                                         r"has 3 classes; .* multi-class likelihoods: robustmax, "
                                         r"softmax"):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before


def test_optimizer_group_reaches_methods_whose_config_named_lbfgs(tmp_path, store_uri):
    # vb's config named lbfgs in method.options: optimizer=adam was dropped (the fit ran L-BFGS)
    # while the run's tags said optimizer adam, applied; its options were never checked
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=vb", "dataset=iris",
                      "dataset.keep_classes=[0,1]", "optimizer=adam",
                      "optimizer.options.learning_rate=-0.1", "iterations=1")
    before = len(store_runs(store_uri))
    with pytest.raises(InputError, match=r"optimizer 'adam'.*learning_rate"):
        run_experiment(cfg, output_dir=tmp_path / "bad")
    assert len(store_runs(store_uri)) == before
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=vb", "dataset=iris",
                      "dataset.keep_classes=[0,1]", "optimizer=adadelta", "iterations=1")
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    assert run.data.params["method.options.optimizer"] == "adadelta"
    assert run.data.params["method.options.optimizer_options.rho"] == "0.9"
    assert run.data.tags["optimizer"] == "adadelta"
    assert run.data.tags["optimizer.applied"] == "true"


@pytest.mark.parametrize("overrides", [
    ["method=svi", "optimizer=adam"],  # null: svi chooses its own (lbfgs or adadelta)
    ["method=vb", "optimizer=adam", "method.options.optimizer=lbfgs",
     "method.options.optimizer_options=null"],  # the method's own option wins
], ids=["svi-chooses", "method-option-wins"])
def test_optimizer_applied_tag_says_false_when_the_group_is_not_what_runs(
        tmp_path, store_uri, overrides):
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "dataset=iris",
                      "dataset.keep_classes=[0,1]", "iterations=1", *overrides)
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    assert run.data.tags["optimizer"] == "adam"
    assert run.data.tags["optimizer.applied"] == "false"


@pytest.mark.parametrize("overrides, key", [
    (["optimizer=adam", "optimizer.options.learning_rate=0.5", "batch_size=20"],
     "learning_rate=0.5"),
    (["+optimizer.options.maxfun=2"], "maxfun=2"),
], ids=["adam-learning-rate", "lbfgs-maxfun"])
def test_optimizer_group_options_pep_drops_are_refused_before_any_mlflow_run(
        tmp_path, store_uri, overrides, key):
    # pep/fitc/vfe take the group's optimiser name but not its options: a fit with
    # learning_rate=0.5 equalled the one with 0.01 while the run logged 0.5, applied
    before = len(store_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=pep", "dataset=iris",
                      "dataset.keep_classes=[0,1]", "iterations=1", *overrides)
    with pytest.raises(InputError, match=rf"^optimizer.options.{key} would not reach method "
                                         r"'pep': pep takes the optimizer group's name only"):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before


@pytest.mark.parametrize("overrides, tag, applied", [
    (["optimizer=adam", "batch_size=20"], "adam", "false"),  # Adam, at pep's learning_rate
    (["batch_size=20"], "lbfgs", "false"),  # mini-batches: pep runs Adam
    ([], "lbfgs", "true"),  # L-BFGS-B, and the group has no options to drop
], ids=["adam-group-options-not-taken", "minibatch-runs-adam", "full-batch-lbfgs"])
def test_pep_optimizer_applied_tag_is_true_only_for_what_runs(tmp_path, store_uri, overrides,
                                                              tag, applied):
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=pep", "dataset=iris",
                      "dataset.keep_classes=[0,1]", "iterations=1", *overrides)
    result = run_experiment(cfg, output_dir=tmp_path / "run")
    run = MlflowClient(store_uri).get_run(result["mlflow_run_id"])
    assert (run.data.tags["optimizer"], run.data.tags["optimizer.applied"]) == (tag, applied)


@pytest.mark.parametrize("override, pattern", [
    ("dataset.features=abc", r"features must be a list of column indices .*got 'abc'"),
    ("dataset.features=[0,1.5]", r"features must be a list .*got \[0, 1.5\]"),
    ("dataset.keep_classes=1", r"keep_classes must be a list of class indices .*got 1"),
], ids=["features-str", "features-float", "keep-classes-scalar"])
def test_index_lists_of_the_wrong_type_are_input_errors(tmp_path, store_uri, override, pattern):
    # were a ValueError / TypeError from int(), shown to the user as a traceback
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=laplace",
                      "dataset=breast_cancer", override)
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")


def test_csv_label_column_name_is_an_input_error(tmp_path, store_uri):
    path = tmp_path / "data.csv"
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(20)))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=laplace", "dataset=file",
                      f"dataset.path='{path}'", "+dataset.options.label_column=label")
    with pytest.raises(InputError, match=r"label_column must be a column index .*got 'label'"):
        run_experiment(cfg, output_dir=tmp_path / "run")


@pytest.mark.parametrize("override, pattern", [
    # read with bool(): "maybe" ran as true
    ("kernel.ard=maybe", r"kernel.ard must be true or false; got 'maybe'"),
    ("dataset.standardize=maybe", r"dataset.standardize must be true or false"),
    ("dataset.stratify=1", r"dataset.stratify must be true or false; got 1"),
    ("mlflow.log_model=maybe", r"mlflow.log_model must be true or false"),
    # a ValueError (a traceback) from the progress bar / int()
    ("progress.bar=sometimes", r"progress.bar must be true, false or auto; got 'sometimes'"),
    ("mlflow.flush_every=often", r"mlflow.flush_every must be an integer; got 'often'"),
    ("mlflow.flush_every=2.5", r"mlflow.flush_every must be an integer; got 2.5"),
    ("mlflow.flush_interval_s=soon", r"mlflow.flush_interval_s must be a number"),
], ids=["ard", "standardize", "stratify", "log_model", "bar", "flush-str", "flush-float",
        "interval-str"])
def test_switches_and_buffer_settings_refused_naming_the_key(tmp_path, store_uri, override,
                                                             pattern):
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=laplace",
                      "dataset=breast_cancer", override)
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")


@pytest.mark.parametrize("overrides, pattern", [
    # mini-batches: svi's optimizer null runs AdaDelta, whose ValueError was a traceback, then
    # an InputError inside a FAILED MLflow run
    (["batch_size=50", "method.options.optimizer_options={learning_rate:-1}"],
     r"^optimizer 'adadelta': AdaDelta needs .*learning_rate > 0"),
    # a full batch: L-BFGS-B, which takes no learning rate
    (["method.options.optimizer_options={learning_rate:0.1}"],
     r"^optimizer 'lbfgs' got unknown option\(s\) \['learning_rate'\]"),
    # L-BFGS-B named for mini-batches: svi's refusal, from its optimizer_for
    (["batch_size=50", "method.options.optimizer=lbfgs"],
     r"^svi with L-BFGS-B \(optimizer='lbfgs'\) needs full-batch training"),
], ids=["minibatch-adadelta", "full-batch-lbfgs", "lbfgs-on-minibatches"])
def test_svi_bad_optimizer_option_refused_before_any_mlflow_run(tmp_path, store_uri, overrides,
                                                                 pattern):
    # the optimiser svi runs for the run's batch size (SVI.optimizer_for) is built in prepare
    before = len(store_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=svi", "dataset=iris",
                      "iterations=1", *overrides)
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before


@pytest.mark.parametrize("override, pattern", [
    ("+optimizer.options.maxfun=-3", r"maxfun must be an integer >= 1 or None; got -3"),
    ("+optimizer.options.ftol=tight", r"ftol must be a number >= 0; got 'tight'"),
], ids=["maxfun-negative", "ftol-str"])
def test_bad_lbfgs_settings_refused_before_any_mlflow_run(tmp_path, store_uri, override,
                                                          pattern):
    # were passed to scipy as they were: a negative maxfun ran (and stopped at once), a string
    # failed inside the fit
    before = len(store_runs(store_uri))
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=laplace",
                      "dataset=breast_cancer", override)
    with pytest.raises(InputError, match=pattern):
        run_experiment(cfg, output_dir=tmp_path / "run")
    assert len(store_runs(store_uri)) == before


def test_dense_grid_optimizer_not_refused_by_prepare(tmp_path, store_uri):
    # conf/method/tap.yaml's "or grid (optimizer_options.axes)": the grid search is not one of
    # make_optimizer's, so prepare's check refused it (UnknownNameError) before any run; the
    # dense methods' optimizer_for leaves it to fit, which checks its axes
    cfg = compose_cfg(f"mlflow.tracking_uri='{store_uri}'", "method=tap", "dataset=breast_cancer",
                      "method.options.optimizer=grid",
                      "method.options.optimizer_options={axes:[[0.0],[0.0]]}")
    run_experiment(cfg, output_dir=tmp_path / "run")
    assert (tmp_path / "run" / "result.json").exists()
