"""What every iterative fit shares: the core training loop of the site methods
(``gpinfer.training.loop``), the outer optimiser schedule of the methods whose
hyper-parameters an optimiser moves over a solve (``gpinfer.training.outer``), the mini-batch
schedule of every stochastic fit (``gpinfer.training.minibatch``) and early stopping on a
held-out validation set (``gpinfer.training.early_stopping``)."""
