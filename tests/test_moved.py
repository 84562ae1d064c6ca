"""``gpinfer.moved``: the core stubs of modules that moved into a plugin (issue 23) hand out the
plugin module's objects under the old path with a ``DeprecationWarning`` naming the new one,
refuse unknown names, and name the plugin when it is not installed."""

import importlib
import re
import sys
from pathlib import Path

import pytest

import gpinfer
from gpinfer.moved import MOVED, moved_to, renamed

#: how a stub's module ``__getattr__`` is spelled (at the start of a line)
STUB_LINE = re.compile(r"^__getattr__ = moved_to\(", re.MULTILINE)
#: old path -> (new path, a public name it defines); every stub left in the core
STUBS = {
    "gpinfer.sites.rank_one": ("gpinfer_pep.rank_one", "RankOnePEPSites"),
    "gpinfer.sites.power_tilted": ("gpinfer_pep.power_tilted", "scaled_tilted"),
    "gpinfer.sites.quadratic": ("gpinfer_jj.quadratic", "CollapsedBound"),
    "gpinfer.sites.newton": ("gpinfer_binary.newton", "newton_maximize"),
    "gpinfer.sites.variational": ("gpinfer_svi.variational", "uncollapsed_elbo"),
    "gpinfer.numerics.gaussian_cubature": ("gpinfer_ivm.gaussian_cubature", "softmax_tilted"),
    "gpinfer.numerics.cholupdate": ("gpinfer_ivm.cholupdate", "chollrup"),
    "gpinfer.numerics.gram": ("gpinfer_ep.gram", "weighted_gram"),
    "gpinfer.numerics.diagonal_softmax": ("gpinfer_ivm.diagonal_softmax",
                                          "diagonal_softmax_tilted"),
}


@pytest.mark.parametrize("old", sorted(STUBS))
def test_old_path_warns_and_returns_the_plugins_object(old):
    new, name = STUBS[old]
    stub = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        obj = getattr(stub, name)
    assert obj is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old", sorted(STUBS))
def test_old_path_refuses_unknown_names(old):
    stub = importlib.import_module(old)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        stub.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec(f"from {old} import no_such_name", {})


def test_every_stub_is_listed_here():
    root = Path(gpinfer.__file__).parent
    stubs = [p for p in root.rglob("*.py") if STUB_LINE.search(p.read_text())]
    for path in stubs:
        importlib.import_module(".".join(("gpinfer", *path.relative_to(root).with_suffix("").parts)))
    assert len(stubs) == len(STUBS)
    assert set(MOVED) == set(STUBS)
    assert {old: new for old, (new, _) in MOVED.items()} == {
        old: new for old, (new, _) in STUBS.items()}


def test_missing_plugin_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "gpinfer_nosuch", None)  # import fails
    getattr_ = moved_to("gpinfer.sites.nosuch", "gpinfer_nosuch.mod")
    monkeypatch.delitem(MOVED, "gpinfer.sites.nosuch")
    with pytest.raises(ImportError, match="plugin 'gpinfer-nosuch'"):
        getattr_("anything")


def test_renamed_names_a_public_successor_and_never_a_private_shim():
    """``renamed``: the warning names a public successor; a private one (a shim keeping the old
    calls) is not offered as the new spelling, the hint is."""
    getattr_ = renamed("gpinfer.some", {"Old": "gpinfer.moved:moved_to",
                                        "Shim": "gpinfer.moved:_MISSING"}, hint=" (use moved_to)")
    with pytest.warns(DeprecationWarning, match=r"gpinfer.some.Old is gpinfer.moved.moved_to now"):
        assert getattr_("Old") is moved_to
    with pytest.warns(DeprecationWarning) as record:
        getattr_("Shim")
    message = str(record[0].message)
    assert "gpinfer.some.Shim is deprecated (use moved_to)" in message and "_MISSING" not in message
    with pytest.raises(AttributeError, match="no attribute 'Other'"):
        getattr_("Other")


@pytest.mark.parametrize("old, name", [("gpinfer.sites.inducing", "ClassTerms"),
                                       ("gpinfer.sites.rank_one", "InducingGeometry")])
def test_renamed_warns_at_the_users_line(old, name):
    """A renamed name's warning is reported at the line that reads it, not inside the module's
    own ``__getattr__`` or a ``moved_to`` stub (the default filters show a
    ``DeprecationWarning`` only where the user's code is)."""
    pytest.importorskip("gpinfer_pep")
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning) as record:
        getattr(module, name)
    assert record and {Path(w.filename) for w in record} == {Path(__file__)}
