"""What every iterative fit shares, the engine: the inner site schedule of every site family
(``gpinfer.training.inner``), the outer optimiser schedule of the methods whose
hyper-parameters an optimiser moves over a solve (``gpinfer.training.outer``), the mini-batch
schedule of every stochastic fit (``gpinfer.training.minibatch``), the core training loop of
the site methods whose sites and hyper-parameters move together (``gpinfer.training.loop``)
and early stopping on a held-out validation set (``gpinfer.training.early_stopping``)."""
