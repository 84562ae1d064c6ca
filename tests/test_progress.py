"""The tqdm progress bar: when it is drawn, what it shows, and library fits with verbose."""

from __future__ import annotations

import io

import pytest

from gpinfer.progress import ProgressBar, progress_callback, wants_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_draws_only_on_a_terminal_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert wants_bar("auto", _Terminal()) and not wants_bar("auto", io.StringIO())
    assert wants_bar(True, io.StringIO()) and not wants_bar(False, _Terminal())
    monkeypatch.setenv("CI", "true")
    assert not wants_bar("auto", _Terminal())
    with pytest.raises(ValueError, match="true, false or 'auto'"):
        wants_bar("sometimes")


def test_bar_shows_count_rate_objective_and_last_test_error() -> None:
    out = io.StringIO()
    with ProgressBar(10, "ep/wine s0", show=True, stream=out) as bar:
        bar.update(1, -120.5)
        bar.update(5, -80.25, test_error=0.125)
        bar.update(10, -75.0)  # the last test error stays on display
    text = out.getvalue()
    assert "ep/wine s0" in text and "10/10" in text and "it/s" in text
    assert "objective=-75" in text and "test error=0.1250" in text
    silent = io.StringIO()
    ProgressBar(10, "x", show="auto", stream=silent).update(3, 1.0)
    assert silent.getvalue() == ""


def test_library_fit_with_verbose_draws_a_bar(capsys: pytest.CaptureFixture[str]) -> None:
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    import gpinfer

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:80]
    seen = []
    gpinfer.GPClassifier(method="laplace", max_iter=4, verbose=True).fit(
        X, y[:80], callback=lambda info: seen.append(info.iteration))
    err = capsys.readouterr().err
    assert "laplace" in err and "objective=" in err and f"{len(seen)}/4" in err
    assert seen  # the user's callback still sees every iteration
    gpinfer.GPClassifier(method="laplace", max_iter=2).fit(X, y[:80])
    assert capsys.readouterr().err == ""  # verbose=False: nothing


def test_progress_callback_without_bar_is_the_callback_itself() -> None:
    def cb(info):
        return None

    with progress_callback(False, 5, "x", cb) as wrapped:
        assert wrapped is cb
