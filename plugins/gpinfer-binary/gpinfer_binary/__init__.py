"""The deterministic members of the binary family of Nickisch & Rasmussen (2008).

One distribution for one method family (spec ``binary-approximations-and-mcmc.md`` §2): the six
methods share the dense driver (``gpinfer.sites.driver``), the B-trick, the Jensen bound, the
Newton machinery and dense EP from the core; each module holds only what is unique to its method.
Laplace lives in ``gpinfer-laplace``, the MCMC/AIS gold standard in ``gpinfer-mcmc``.
"""
