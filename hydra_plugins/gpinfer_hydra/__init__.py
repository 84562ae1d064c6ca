"""gpinfer's Hydra plugins (discovered by Hydra in the ``hydra_plugins`` namespace):

* ``searchpath.GPInferSearchPathPlugin``: every gpinfer plugin's own ``conf/`` on the search path;
* ``sweeper.GPInferSweeper`` (``hydra/sweeper: gpinfer``): Hydra's basic sweeper made for large
  sweeps: a covering set of configs checked instead of every job's, job folders that name the
  swept keys, a report when the sweep fails or is interrupted, Ctrl-C taken between
  compositions.
"""
