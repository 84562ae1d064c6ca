"""Multi-class informative vector machine (Seeger & Jordan), spec ``ivm-multiclass``.

Modules: ``projection`` (restricted ADF projection, §2.6), ``solid`` (compact representation,
§2.2-2.4, block mode and prediction §2.10), ``liquid`` (liquid-set EP representation, §2.9),
``inference`` (greedy selection driver, §2.7-2.9), ``criterion`` (learning criterion, §3),
``baseline`` (independent-process baseline, §4), ``method`` (the ``ivm`` and ``ivm-baseline``
entry points).
"""
