"""``python -m gpinfer``: the experiment app, the same as the ``gpinfer-run`` command."""

from __future__ import annotations

from gpinfer.experiment.app import main

if __name__ == "__main__":
    main()
