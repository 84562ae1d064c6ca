"""gpinfer's Hydra plugins (discovered by Hydra in the ``hydra_plugins`` namespace):

* ``searchpath.GPInferSearchPathPlugin``: every gpinfer plugin's own ``conf/`` on the search path;
* ``sweeper.GPInferSweeper`` (``hydra/sweeper: gpinfer``): Hydra's basic sweeper, with progress
  while it composes a large sweep before the first job.
"""
