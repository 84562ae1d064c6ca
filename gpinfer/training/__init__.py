"""What every iterative fit shares: the core training loop of the site methods
(``gpinfer.training.loop``) and early stopping on a held-out validation set
(``gpinfer.training.early_stopping``)."""
