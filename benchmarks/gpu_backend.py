"""gpinfer's torch backend on a GPU (issues "The scalable methods on a GPU" and 25): six parts.

``mnist``: sep, M = 200 per class, on MNIST (60k train / 10k test of ``mnist.npz``, pixels / 255
as ``sep_mnist.py``: ARD RBF, median length-scale heuristic, white noise 1, inducing inputs M
random training inputs per class), ``backend="torch"`` on ``--device`` (cuda), ``--dtype``
float32 (float64 as an option), mini-batches of ``--batch-size`` 1024, Adam at ``--lr`` 3e-3
(``sep_mnist.py``'s second setting; 1e-3 is the paper's with batches of 200), a training-time
budget of ``--budget-s`` 150 s (the method option ``time_limit_s``). At the end of an epoch (one
outer iteration, 59 steps at 1024), at least ``--eval-every-s`` 1 s of training after the last
evaluation (0: every epoch), the callback builds the posterior and evaluates the full test set:
``posterior.predict_proba`` of the test inputs held on the device in float64 (the latent
moments and the argmax likelihood's 1-D quadrature run there), test error and NLL
(``-mean log p(y*)``); ``IterationInfo.elapsed`` is the training time with the
callback's time left out. Then: time to reach each test-error level
(5 %, 3 %, 2.65 %, 2.5 %, 2.2 %, 2.1 %), the best error / NLL within 60 s and within the budget,
peak GPU memory (``torch.cuda.max_memory_allocated``, on CUDA only). A short warm-up fit on a
subset first loads the CUDA kernels (``--no-warmup`` to count it).

``synthetic``: N = 10^5 and 10^6 (``--sizes``) points, D = 20, C = 10 (x ~ N(0, I), labels the
argmax of fixed random Fourier features plus noise, generated in host memory), sep with M = 100
per class, batches of 1000. First numpy on one CPU core (one BLAS thread): ``--cpu-batches``
200 batches of 1000 (a subset; the per-batch cost of sep does not depend on N), two epochs,
epoch 2 timed. Then each N on the device, smallest first, ``--epochs`` 2: the time of epoch 2
(epoch 1 holds the warm-up) per epoch and per batch, the numpy epoch extrapolated to N / 1000
batches (the output says so), the speed-up per batch, and the peak GPU memory of each N (it
should not depend on N: only a batch is moved to the device); one JSON line per N.

``satellite``: one full-batch iteration (kernel quantities, one damped parallel site sweep,
log Z_q and its gradient, the kernel VJP, one sign-adaptive step: what ``fit`` does per
iteration, as ``sep_satellite_iteration.py`` times) on Satellite-sized synthetic data (N = 6435,
D = 36, C = 6, M = 644 per class) for sep (``--dtype``) and ep (float64 always: ep refuses
float32) on the device, against numpy on one core; iterations 2..R+1 timed from the callback's
``elapsed`` (iteration 1 moves X to the device and loads kernels).

``profile``: sep steps at MNIST size (D = 784, C = 10, M = ``--M`` per class, batches of
``--batch-size``) and svi steps (robust-max, same sizes), each with its optimiser update,
under ``torch.profiler``: aten operators (top-level and all), host syncs, and on CUDA kernel
launches and GPU busy time per step (``gpinfer.testing.step_profile``), and the syncs of one
window of ``--read-every`` steps (sep's ``read_every``, svi's ``report_every``: their values
and checks are read once per window). With ``--device cpu`` the aten-op count is the launch
proxy.
Each of sep and svi also gets its milliseconds per step, without the profiler: a fit of
``--timed-epochs`` 3 epochs (svi: reported iterations) of ``--timed-steps`` 10 steps, the
fastest after the first. ``--compile default`` / ``reduce-overhead`` counts and times sep's
compiled step (its ``compile`` option; epoch 1 compiles); ``--profile-methods`` picks sep and / or
svi.

``tri`` (issue 25, item 3): the step's solves with the Cholesky factor ``L [C, M, M]`` of Kuu at
MNIST size (C 10, M ``--M``, B ``--batch-size``), ``trsm`` each time against ``L^-1`` once
(``ops.tri_inverse``) and products (``ops.tri_matmul``), interleaved: each operation's ms, a
step's four solves (``L^-1 Kuf``, ``L^-T X`` of ``[C, M, B]``, the sandwich ``L^-T S L^-1``)
either way, the faster way against what ``ops.prefers_tri_inverse`` chooses today, and the
largest relative difference of the two ways' results in ``--dtype``.

``svi``: the svi step (robust-max, Adam, the synthetic data, D 20, C 10, M 100, B 1000) on the
device against numpy on one core (``--svi-steps`` 20 steps per timed iteration on the device, 10
on numpy; the fastest iteration after the first): the speed-up.

``all`` runs the six in turn. ``--smoke`` shrinks everything (MNIST 2000 / 500 points, M = 20,
batches of 256, 20 s, evaluations every 2 s; synthetic N = 10^4 and 2 x 10^4, M = 20, 20 numpy
batches; Satellite N = 644, M = 64) so that ``all --smoke --device cpu`` runs on torch-CPU in
about two minutes.
Human-readable lines on stdout, one JSON line per measurement appended to ``--out``
(``outputs/gpu_backend.jsonl``).

GPU session plan (issue 25: one ``run`` call, ~6 min of commands, 7-8 min of device time)
------------------------------------------------------------------------------------------
Here, once, in the checkout that the device tool sends (``.gpu/`` is git-ignored; nothing can be
fetched on the GPU machine and ``../shared`` does not travel; ~21 MB)::

    mkdir -p .gpu/data && cp ../shared/data/mnist.npz .gpu/data/
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d .gpu/whl array-api-compat==1.16.0

python3 there holds CUDA torch 2.11, numpy, scipy, scikit-learn, threadpoolctl and setuptools;
``benchmarks/gpu_session.sh`` installs gpinfer with the ep (sep) and svi plugins and the wheel
into ``/tmp/site`` (a copy with the entry points, ~20 s) when ``import gpinfer_ep`` fails. Then
one call, ``run(command="bash benchmarks/gpu_session.sh", carry=[".gpu"], timeout_s=480)``
(``--budget-s`` 450 s for the parts; a machine's start adds ~1-2 minutes of device time). Parts,
most important first, each capped by ``timeout``; each keeps back the least that the selected
parts after it need (the script's ``needs``: the cap shrinks, the MNIST run keeps its 100 s);
so a slow part cuts itself, not the later ones. Each JSON line lands in
``$OUT/gpu.jsonl`` as soon as it is measured (the full log in ``$OUT/session.log``, the result
lines on stdout, a last ``"part": "session"`` line with each part's exit status and seconds):

====================  =====  ===============  ===================================================
part (``--only``)     cap s  expected (H100)  lines (``part`` / ``library``) and the target
====================  =====  ===============  ===================================================
``profile``           75     ~40 s            ``profile`` / ``gpinfer-sep``: ``ms_per_step`` <= 16
                                              (MNIST size, B 1024, float32, eager), launches,
                                              aten ops, host syncs, GPU busy ms; ``gpinfer-svi``
                                              and ``-svi-window``: the same for svi
``tri``               30     ~10 s            ``tri``: ``measured_choice`` (trsm or inverse) vs
                                              ``prefers_tri_inverse`` (item 3: choose per device)
``profile-compiled``  110    ~60-90 s         ``profile`` / ``gpinfer-sep``, ``compile``
                                              ``reduce-overhead``: ``ms_per_step`` <= 16 compiled
``synthetic``         130    ~100 s           ``synthetic``, N 10^5 then 10^6 (25 numpy batches):
                                              ``speedup_per_batch`` >= 20; ``peak_gpu_mb_by_N``
                                              equal across N (memory independent of N)
``svi``               40     ~15 s            ``svi``: ``speedup`` >= 10 (numpy on one core)
``mnist``             120    ~90 s            ``mnist``, Adam at 1e-2 (the best rate of the last
                                              GPU run), 60 s of training, evaluations every 3 s:
                                              ``summary.within_60s``: ``best_error`` <= 0.021 and
                                              ``best_nll`` <= 0.075 (``target_met``)
====================  =====  ===============  ===================================================

If the call is cut or a part fails, rerun only what is missing while the machine is warm, e.g.
``bash benchmarks/gpu_session.sh --only synthetic,mnist --budget-s 240`` (``timeout_s`` 270),
then ``give_back``. Left out of the one call (a later session with time to spare): the GPyTorch
SVGP comparison (``gpu_gpytorch_svgp.py --budget-s 60``, ~2 min), ``satellite`` (~3 min),
``mnist --dtype float64``.

Here (no GPU), the same call on torch-CPU, tiny sizes, every JSON line (~3-4 minutes under load;
``GPINFER_DATA_DIR`` where ``../shared/data`` is not beside the checkout, as in a worktree)::

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHON=.venv/bin/python OUT=outputs/gpu_session \
        GPINFER_DATA_DIR=/work/shared/data bash benchmarks/gpu_session.sh --device cpu --smoke

or one part: ``.venv/bin/python benchmarks/gpu_backend.py all --smoke --device cpu
--torch-threads 1``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_step import mnist_like  # noqa: E402 - MNIST-like pixels, D 784 and C 10
from gpu_gpytorch_svgp import (  # noqa: E402 - shared with the peer (torch/numpy only)
    TrainingPeak,
    append_jsonl,
    default_data,
    device_info,
    error_nll,
    load_mnist,
    print_summary,
    summarize,
)

from gpinfer.estimator import GPClassifier  # noqa: E402
from gpinfer.kernels import make_kernel  # noqa: E402


def torch_settings(args: argparse.Namespace, dtype: str | None = None) -> dict[str, str]:
    return {"backend": "torch", "device": args.device, "dtype": dtype or args.dtype}


def cuda_reset(args: argparse.Namespace) -> None:
    if args.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def cuda_peak_mb(args: argparse.Namespace) -> float | None:
    if args.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    return None


def sep(M: int, D: int, batch: int | None, epochs: int, options: dict, settings: dict,
        seed: int = 0) -> GPClassifier:
    return GPClassifier(method="sep", M=M, kernel=make_kernel("rbf", D, ard=True),
                        max_iter=epochs, batch_size=batch, random_state=seed,
                        method_options=options, **settings)


# ------------------------------------------------------------------------------------------
# MNIST
# ------------------------------------------------------------------------------------------
def run_mnist(args: argparse.Namespace) -> None:
    n_train, n_test, M, batch, budget = 0, 0, args.M, args.batch_size, args.budget_s
    if args.smoke:
        n_train, n_test, M, batch, budget = 2000, 500, min(M, 20), min(batch, 256), min(budget,
                                                                                        20.0)
    Xtr, ytr, Xte, yte = load_mnist(args.data, n_train or None, n_test or None)
    settings = torch_settings(args)
    opts = {"adam_learning_rate": args.lr}
    if not args.no_warmup:  # CUDA context, cuBLAS / cuSOLVER kernels: not part of the race
        sub = np.random.default_rng(1).choice(len(ytr), min(len(ytr), 2 * batch), replace=False)
        sep(M, Xtr.shape[1], batch, 1, opts, settings).fit(Xtr[sub], ytr[sub])
    cuda_reset(args)
    import torch

    tracker = TrainingPeak(torch, args.device)
    trace: list[dict] = []
    # the test inputs on the device, float64: the posterior's predictions (latent moments and
    # the argmax likelihood's quadrature) then run there
    Xte_device = torch.as_tensor(Xte, dtype=torch.float64, device=args.device)

    def callback(info) -> None:
        if trace and info.elapsed < trace[-1]["train_s"] + args.eval_every_s \
                and info.elapsed < budget:
            return  # not due (the budget's last epoch is always evaluated)
        tracker.pause()
        P = info.posterior().predict_proba(Xte_device)
        err, nll = error_nll(P, yte)
        trace.append({"train_s": info.elapsed, "epoch": info.iteration,
                      "objective": info.objective, "test_error": err, "test_nll": nll,
                      "failures": info.extra.get("failures", 0.0)})
        r = trace[-1]
        print(f"  epoch {r['epoch']:3d}  train {r['train_s']:7.1f} s  test error "
              f"{100 * err:6.2f} %  NLL {nll:.4f}  log Z_q {info.objective:.4g}", flush=True)
        tracker.resume()

    wall0 = time.perf_counter()
    est = sep(M, Xtr.shape[1], batch, 100_000, {**opts, "time_limit_s": budget}, settings)
    est.fit(Xtr, ytr, callback=callback)
    wall = time.perf_counter() - wall0
    peak = tracker.mb()
    s = summarize(trace, budget)
    steps = math.ceil(len(ytr) / batch)
    label = (f"gpinfer sep MNIST N={len(ytr)} M={M}/class batch={batch} lr={args.lr} "
             f"{args.dtype} on {args.device}")
    print_summary(label, s, peak)
    last = est.history_[-1] if est.history_ else {}
    print(f"   {est.n_iter_} epochs of {steps} steps, "
          f"{1e3 * s['train_s_total'] / max(est.n_iter_ * steps, 1):.1f} ms/step "
          f"(approx.: the last epoch may be cut by the budget); failures "
          f"{last.get('failures', 0.0):.0f}; wall {wall:.1f} s with evaluations and set-up")

    append_jsonl(args.out, {
        "part": "mnist", "library": "gpinfer-sep", "time": time.time(),
        **device_info(torch, args.device), "dtype": args.dtype, "M": M, "batch_size": batch,
        "lr": args.lr, "n_train": len(ytr), "n_test": len(yte), "smoke": args.smoke,
        "warmup": not args.no_warmup, "peak_gpu_mb": peak, "wall_s": wall,
        "epochs": est.n_iter_, "summary": s,
        "trace": trace})


# ------------------------------------------------------------------------------------------
# synthetic N = 10^6
# ------------------------------------------------------------------------------------------
def synthetic(N: int, D: int, C: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``x ~ N(0, I_D)``, ``y = argmax_c f_c(x) + noise`` with fixed random Fourier features
    (host memory; generated in chunks)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((C, 16, D)) / np.sqrt(D)
    b = rng.uniform(0, 2 * np.pi, (C, 16))
    X = rng.standard_normal((N, D))
    y = np.empty(N, dtype=np.int64)
    for i in range(0, N, 100_000):
        f = np.cos(np.einsum("nd,cfd->ncf", X[i:i + 100_000], W) + b).sum(axis=2)
        y[i:i + 100_000] = np.argmax(f + 0.3 * rng.standard_normal(f.shape), axis=1)
    return X, y


def epoch_times(est: GPClassifier, X: np.ndarray, y: np.ndarray) -> list[float]:
    """Training seconds of each epoch (``elapsed`` differences; epoch 1 from the loop's
    start)."""
    marks: list[float] = []
    est.fit(X, y, callback=lambda info: marks.append(info.elapsed))
    return [b - a for a, b in zip([0.0, *marks[:-1]], marks, strict=True)]


def run_synthetic(args: argparse.Namespace) -> None:
    """numpy on one core first (``--cpu-batches`` batches, two epochs, the second timed), then
    each N of ``--sizes`` on the device, smallest first, one JSON line per N as soon as it is
    measured (with the per-batch speed-up over numpy: a time limit loses only the larger N)."""
    D, C, B = 20, 10, 1000
    M = min(args.synthetic_M, 20) if args.smoke else args.synthetic_M
    sizes = [10_000, 20_000] if args.smoke else [int(float(s)) for s in args.sizes.split(",")]
    cpu_batches = min(args.cpu_batches, 20) if args.smoke else args.cpu_batches
    opts = {"adam_learning_rate": 1e-3}
    settings = torch_settings(args)
    import torch

    X, y = synthetic(max(sizes), D, C)
    # numpy on one core: a subset of cpu_batches batches, two epochs, the second timed
    n_cpu = min(cpu_batches * B, max(sizes))
    with threadpool_limits(limits=1):
        t = epoch_times(sep(M, D, B, 2, opts, {}), X[:n_cpu], y[:n_cpu])
    cpu_batch = t[-1] / math.ceil(n_cpu / B)
    print(f"  sep numpy, one core (1 BLAS thread): {1e3 * cpu_batch:.1f} ms/batch, measured on "
          f"{math.ceil(n_cpu / B)} batches (epoch 2 of a {n_cpu}-point subset)", flush=True)
    peaks: list[float | None] = []
    for N in sizes:
        cuda_reset(args)
        t = epoch_times(sep(M, D, B, args.epochs, opts, settings), X[:N], y[:N])
        peak = cuda_peak_mb(args)
        peaks.append(peak)
        nb = math.ceil(N / B)
        timed = t[1:] if len(t) > 1 else t
        per_epoch = float(np.mean(timed))
        row = {"N": N, "epoch_s": per_epoch, "batch_ms": 1e3 * per_epoch / nb,
               "epoch_times_s": t, "peak_gpu_mb": peak}
        speedup = cpu_batch / (row["batch_ms"] / 1e3)
        print(f"== synthetic sep on {args.device} {args.dtype}: N={N:>8d} D={D} C={C} M={M} "
              f"B={B}: epoch {per_epoch:.2f} s ({row['batch_ms']:.2f} ms/batch; epoch 1 with "
              f"warm-up {t[0]:.2f} s) vs numpy one core {cpu_batch * nb:.1f} s (extrapolated "
              f"from {1e3 * cpu_batch:.1f} ms/batch): speed-up {speedup:.1f} x (target >= 20 x)"
              + (f"; peak GPU memory {peak:.1f} MB" if peak is not None else ""), flush=True)
        append_jsonl(args.out, {
            "part": "synthetic", "library": "gpinfer-sep", "time": time.time(),
            **device_info(torch, args.device), "dtype": args.dtype, "D": D, "C": C, "M": M,
            "batch_size": B, "smoke": args.smoke, "device_run": row,
            "numpy_one_core": {"batch_ms": 1e3 * cpu_batch, "batches_measured":
                               math.ceil(n_cpu / B), "epoch_s_extrapolated": cpu_batch * nb},
            "speedup_per_batch": speedup,
            "peak_gpu_mb_by_N": dict(zip(map(str, sizes), peaks))})
    known = [p for p in peaks if p is not None]
    if len(known) > 1:
        print(f"   peak GPU memory max / min over N: {max(known) / min(known):.3f} "
              "(independent of N if ~1)")


# ------------------------------------------------------------------------------------------
# Satellite-sized full batch
# ------------------------------------------------------------------------------------------
def iteration_times(method: str, X, y, M: int, iters: int, settings: dict) -> list[float]:
    """Seconds of full-batch iterations 2..iters+1 (``elapsed`` differences)."""
    marks: list[float] = []
    est = GPClassifier(method=method, M=M, kernel=make_kernel("rbf", X.shape[1], ard=True),
                       max_iter=iters + 1, random_state=0, **settings)
    est.fit(X, y, callback=lambda info: marks.append(info.elapsed))
    return [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]


def run_satellite(args: argparse.Namespace) -> None:
    N, D, C, M = (644, 36, 6, 64) if args.smoke else (6435, 36, 6, 644)
    X, y = synthetic(N, D, C, seed=1)
    import torch

    for method in args.methods.split(","):
        dtype = args.dtype if method == "sep" else "float64"  # ep: float64 only
        dev = iteration_times(method, X, y, M, args.iters, torch_settings(args, dtype))
        with threadpool_limits(limits=1):
            cpu = iteration_times(method, X, y, M, max(1, min(args.iters, 2)), {})
        print(f"== satellite {method}: one batch iteration N={N} D={D} C={C} M={M}: "
              f"{args.device} {dtype} min {min(dev):.3f} s (all {[round(t, 3) for t in dev]}), "
              f"numpy one core min {min(cpu):.2f} s (all {[round(t, 2) for t in cpu]}): "
              f"speed-up {min(cpu) / min(dev):.1f} x (target: device < 1 s)", flush=True)
        append_jsonl(args.out, {
            "part": "satellite", "library": f"gpinfer-{method}", "time": time.time(),
            **device_info(torch, args.device), "dtype": dtype, "N": N, "D": D, "C": C, "M": M,
            "smoke": args.smoke, "device_iteration_s": dev, "numpy_one_core_iteration_s": cpu})


# ------------------------------------------------------------------------------------------
# Operations per step
# ------------------------------------------------------------------------------------------
def svi(M: int, D: int, batch: int, iters: int, every: int, settings: dict,
        seed: int = 0) -> GPClassifier:
    """svi, robust-max, Adam at 1e-3: ``iters`` reported iterations of ``every`` steps."""
    return GPClassifier(method="svi", M=M, kernel=make_kernel("rbf", D, ard=True),
                        likelihood="robustmax", max_iter=iters, batch_size=batch,
                        random_state=seed, baseline_failure="warn",
                        method_options={"optimizer": "adam", "report_every": every,
                                        "optimizer_options": {"learning_rate": 1e-3}},
                        **settings)


def step_ms(est: GPClassifier, X: np.ndarray, y: np.ndarray, steps: int) -> tuple[float, list]:
    """Milliseconds per step of ``est`` (each reported iteration ``steps`` steps): the fastest
    iteration after the first (which loads kernels or compiles), and every iteration's
    seconds (``IterationInfo.elapsed`` differences: training time, read on the host at each
    iteration's end)."""
    t = epoch_times(est, X, y)
    return 1e3 * min(t[1:] if len(t) > 1 else t) / steps, t


def run_profile(args: argparse.Namespace) -> None:
    """Per step of sep (MNIST size: D 784, C 10, M ``--M`` per class, batches of
    ``--batch-size``; a step with its optimiser update, ``--read-every`` steps read together)
    and of svi (robust-max, the same sizes, M shared; a step with its optimiser update, values
    and checks read once per reported iteration of ``--read-every`` steps): aten operators,
    host syncs and, on CUDA, kernel launches and GPU busy time
    (``gpinfer.testing.step_profile``), then milliseconds per step (``step_ms``: a fit of
    ``--timed-epochs`` epochs of ``--timed-steps`` steps, the fastest epoch after the first).
    Each line also gives the counts of one window of ``--read-every`` steps with its read.
    MNIST-like random pixels (``mnist_like``); ``--smoke``: M 20, batches of 256.
    ``--profile-methods`` picks sep and / or svi (``--compile`` applies to sep only)."""
    import torch
    from gpinfer_svi.method import SVI

    from gpinfer.testing.step_profile import profile_steps
    from gpinfer.training.minibatch import MiniBatchSchedule

    D, C = 784, 10
    M, B = (20, 256) if args.smoke else (args.M, args.batch_size)
    k = int(args.read_every)
    X, y = mnist_like(n=4 * k * B)
    cuda = args.device.startswith("cuda")
    settings = torch_settings(args)
    sep_opts = {"adam_learning_rate": 1e-3, "compile": args.compile, "read_every": k}

    def fit_sep() -> None:  # two epochs: counts, not a model
        sep(M, D, B, 2, sep_opts, settings).set_params(baseline_failure="warn").fit(X, y)

    def fit_svi() -> None:
        svi(M, D, B, 3, k, settings).fit(X, y)

    methods = args.profile_methods.split(",")
    # sep: the windows of epoch 2 (k steps each); svi: its second reported iteration
    cases = [case for case in (("sep", fit_sep, MiniBatchSchedule, "_group", 4 + 1, k),
                               ("svi", fit_svi, SVI, "_step", k + 1, 1),
                               ("svi-window", fit_svi, MiniBatchSchedule, "_group", 2, k))
             if case[0].split("-")[0] in methods]
    n_timed = args.timed_steps * B
    Xt, yt = mnist_like(seed=1, n=n_timed)
    for name, fit, owner, target, first, per in cases:
        counts = profile_steps(fit, owner, target, first=first, steps=3 if per == 1 else 2,
                               cuda=cuda)
        per_step = {key: v / per for key, v in counts.items() if key != "steps_profiled"}
        timing: dict = {}
        if name != "svi-window":  # the step's time, without the profiler
            est = (sep(M, D, B, args.timed_epochs, sep_opts, settings)
                   .set_params(baseline_failure="warn") if name == "sep"
                   else svi(M, D, B, args.timed_epochs, args.timed_steps, settings))
            ms, epochs_s = step_ms(est, Xt, yt, args.timed_steps)
            timing = {"ms_per_step": ms, "timed_epochs_s": epochs_s,
                      "timed_steps_per_epoch": args.timed_steps}
        mode = f" compile={args.compile}" if name == "sep" else ""
        print(f"== profile {name} step on {args.device} {args.dtype}{mode} (D={D} C={C} M={M} "
              f"B={B} read every {k}): "
              + (f"{timing['ms_per_step']:.2f} ms/step"
                 + (" (target <= 16 ms on an H100 at B 1024); " if name == "sep" else "; ")
                 if timing else "")
              + "per step " + ", ".join(f"{key} {v:.2f}" for key, v in per_step.items())
              + (f"; per window of {k}: host_syncs {counts['host_syncs']:.0f}"
                 if per > 1 else ""), flush=True)
        append_jsonl(args.out, {
            "part": "profile", "library": f"gpinfer-{name}", "time": time.time(),
            **device_info(torch, args.device), "dtype": args.dtype, "D": D, "C": C, "M": M,
            "batch_size": B, "smoke": args.smoke, "read_every": k,
            "compile": args.compile if name == "sep" else "none", **per_step, **timing})


# ------------------------------------------------------------------------------------------
# triangular solves: trsm each time, or the inverse once and products (item 3)
# ------------------------------------------------------------------------------------------
def device_ms(fns: dict[str, Callable[[], object]], cuda: bool, repeats: int,
              rounds: int = 5) -> dict[str, float]:
    """Milliseconds per call of each of ``fns``: the median over ``rounds`` of the mean of
    ``repeats`` calls, the functions interleaved round by round (the device synchronised
    around each block on CUDA); one untimed call each first."""
    import torch

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            sync()
            times[name].append(1e3 * (time.perf_counter() - t0) / repeats)
    return {name: float(np.median(t)) for name, t in times.items()}


def run_tri(args: argparse.Namespace) -> None:
    """The step's solves with the Cholesky factor ``L [C, M, M]`` of ``Kuu`` (C 10, M ``--M``,
    batches of ``--batch-size``), each way ``gpinfer.sites.stacked`` can take them
    (``ops.prefers_tri_inverse``): ``trsm`` each time (``ops.solve_triangular``), or
    ``L^-1`` once (``ops.tri_inverse``) and products (``ops.tri_matmul``). The solves of a sep
    step: ``A = L^-1 Kuf`` and ``G_uf = L^-T X`` (``[C, M, B]``), the sandwich
    ``L^-T S L^-1`` (two of ``[C, M, M]``); ``cholesky_inverse`` (``Kuu^-1`` from ``L``) for
    reference. The totals per step and the choice; the largest relative difference between
    the two ways' results (the inverse's rounding in ``--dtype``)."""
    import torch

    from gpinfer.backend import ops

    C, M, B = (10, 20, 256) if args.smoke else (10, args.M, args.batch_size)
    cuda = args.device.startswith("cuda")
    dt = getattr(torch, args.dtype)
    rng = np.random.default_rng(0)
    G = rng.standard_normal((C, M, M))
    K = G @ np.swapaxes(G, 1, 2) / M + 0.1 * np.eye(M)

    def dev(a: np.ndarray):
        return torch.as_tensor(a, dtype=dt, device=args.device)

    L = torch.linalg.cholesky(dev(K))
    L_T = L.mT.contiguous()
    Kuf, Xw, S = (dev(rng.standard_normal((C, M, B))), dev(rng.standard_normal((C, M, B))),
                  dev(np.eye(M) + G @ np.swapaxes(G, 1, 2) / M))
    L_inv = ops.tri_inverse(L)

    def by_trsm():
        T = ops.solve_triangular(L, S, transpose=True, L_T=L_T)
        return (ops.solve_triangular(L, Kuf), ops.solve_triangular(L, Xw, transpose=True, L_T=L_T),
                ops.solve_triangular(L, T, right=True))

    def by_inverse(inv=None):
        inv = ops.tri_inverse(L) if inv is None else inv
        T = ops.tri_matmul(inv, S, transpose=True)
        return (ops.tri_matmul(inv, Kuf), ops.tri_matmul(inv, Xw, transpose=True),
                ops.tri_matmul(inv, T, right=True))

    fns = {"trsm_wide": lambda: ops.solve_triangular(L, Kuf),
           "trsm_wide_T": lambda: ops.solve_triangular(L, Xw, transpose=True, L_T=L_T),
           "trsm_square": lambda: ops.solve_triangular(L, S, transpose=True, L_T=L_T),
           "trsm_square_right": lambda: ops.solve_triangular(L, S, right=True),
           "tri_inverse": lambda: ops.tri_inverse(L),
           "product_wide": lambda: ops.tri_matmul(L_inv, Kuf),
           "product_wide_T": lambda: ops.tri_matmul(L_inv, Xw, transpose=True),
           "product_square": lambda: ops.tri_matmul(L_inv, S, transpose=True),
           "product_square_right": lambda: ops.tri_matmul(L_inv, S, right=True),
           "cholesky_inverse": lambda: torch.cholesky_inverse(L),
           "step_by_trsm": by_trsm, "step_by_inverse": by_inverse}
    ms = device_ms(fns, cuda, repeats=3 if args.smoke else 20)
    diff = max(float((a - b).abs().max() / b.abs().max())
               for a, b in zip(by_inverse(L_inv), by_trsm(), strict=True))
    choice = "inverse" if ms["step_by_inverse"] < ms["step_by_trsm"] else "trsm"
    current = "inverse" if ops.prefers_tri_inverse(L) else "trsm"
    print(f"== tri on {args.device} {args.dtype} (C={C} M={M} B={B}): per call "
          + ", ".join(f"{name} {v:.3f} ms" for name, v in ms.items())
          + f"; a step's four solves with L: trsm {ms['step_by_trsm']:.3f} ms vs inverse once + "
          f"products {ms['step_by_inverse']:.3f} ms -> {choice} (ops.prefers_tri_inverse says "
          f"{current}); max relative difference {diff:.1e}", flush=True)
    append_jsonl(args.out, {
        "part": "tri", "time": time.time(), **device_info(torch, args.device),
        "dtype": args.dtype, "C": C, "M": M, "batch_size": B, "smoke": args.smoke,
        "ms": ms, "measured_choice": choice, "prefers_tri_inverse": current == "inverse",
        "max_relative_difference": diff})


# ------------------------------------------------------------------------------------------
# synthetic svi step
# ------------------------------------------------------------------------------------------
def run_svi(args: argparse.Namespace) -> None:
    """The svi step (robust-max, Adam, D 20, C 10, M ``--synthetic-M``, batches of 1000, the
    synthetic data of ``synthetic``; its optimiser update included) on the device against
    numpy on one core (one BLAS thread): ``step_ms`` of ``--svi-iters`` iterations of
    ``--svi-steps`` steps each on the device, of 3 iterations of ``--svi-steps`` / 2 steps on
    numpy. Target: >= 10 x."""
    import torch

    D, C, B = 20, 10, 1000
    M = min(args.synthetic_M, 20) if args.smoke else args.synthetic_M
    steps = min(args.svi_steps, 4) if args.smoke else args.svi_steps
    cpu_steps = max(1, steps // 2)
    X, y = synthetic(max(steps, cpu_steps) * B, D, C)
    dev_ms, dev_t = step_ms(svi(M, D, B, args.svi_iters, steps, torch_settings(args)),
                            X[:steps * B], y[:steps * B], steps)
    with threadpool_limits(limits=1):
        cpu_ms, cpu_t = step_ms(svi(M, D, B, 3, cpu_steps, {}), X[:cpu_steps * B],
                                y[:cpu_steps * B], cpu_steps)
    print(f"== svi step (robust-max, D={D} C={C} M={M} B={B}): {args.device} {args.dtype} "
          f"{dev_ms:.2f} ms vs numpy one core {cpu_ms:.1f} ms: speed-up {cpu_ms / dev_ms:.1f} x "
          "(target >= 10 x)", flush=True)
    append_jsonl(args.out, {
        "part": "svi", "library": "gpinfer-svi", "time": time.time(),
        **device_info(torch, args.device), "dtype": args.dtype, "D": D, "C": C, "M": M,
        "batch_size": B, "smoke": args.smoke, "device_ms_per_step": dev_ms,
        "device_iterations_s": dev_t, "device_steps_per_iteration": steps,
        "numpy_one_core_ms_per_step": cpu_ms, "numpy_iterations_s": cpu_t,
        "numpy_steps_per_iteration": cpu_steps, "speedup": cpu_ms / dev_ms})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("mnist", "synthetic", "satellite", "profile", "tri", "svi",
                                     "all"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--out", default=str(ROOT / "outputs" / "gpu_backend.jsonl"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (torch-CPU check)")
    ap.add_argument("--compile", default="none", choices=("none", "default", "reduce-overhead"),
                    help="sep's compile option (profile: the compiled step's counts)")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch CPU threads (device cpu; default torch's)")
    g = ap.add_argument_group("mnist")
    g.add_argument("--data", default=default_data(), help="mnist.npz")
    g.add_argument("--M", type=int, default=200, help="inducing inputs per class")
    g.add_argument("--batch-size", type=int, default=1024)
    g.add_argument("--read-every", type=int, default=1,
                   help="profile: steps read together (sep read_every, svi report_every)")
    g.add_argument("--lr", type=float, default=3e-3, help="Adam step")
    g.add_argument("--budget-s", type=float, default=150.0, help="training seconds")
    g.add_argument("--no-warmup", action="store_true",
                   help="count CUDA start-up (kernel loading) in the training time")
    g.add_argument("--eval-every-s", type=float, default=1.0,
                   help="evaluate at the end of the first epoch this many training seconds "
                        "after the last evaluation (0: every epoch; smoke: 2)")
    g.add_argument("--profile-methods", default="sep,svi", help="profile: sep and / or svi")
    g.add_argument("--timed-steps", type=int, default=10,
                   help="profile: steps per timed epoch (ms per step)")
    g.add_argument("--timed-epochs", type=int, default=3,
                   help="profile: timed epochs (the first, with warm-up, is left out)")
    g = ap.add_argument_group("synthetic")
    g.add_argument("--sizes", default="1e5,1e6", help="N values (the last one is compared)")
    g.add_argument("--synthetic-M", type=int, default=100)
    g.add_argument("--epochs", type=int, default=2, help="epochs on the device (2..: timed)")
    g.add_argument("--cpu-batches", type=int, default=200,
                   help="numpy batches per epoch (one core), extrapolated to N")
    g.add_argument("--svi-steps", type=int, default=20,
                   help="svi: steps per timed iteration on the device (numpy: half)")
    g.add_argument("--svi-iters", type=int, default=4,
                   help="svi: iterations on the device (the first is left out)")
    g = ap.add_argument_group("satellite")
    g.add_argument("--methods", default="sep,ep")
    g.add_argument("--iters", type=int, default=3, help="timed iterations on the device")
    args = ap.parse_args()
    import torch

    if args.smoke:
        args.eval_every_s = max(args.eval_every_s, 2.0)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name(torch.device(args.device))})"
             if args.device.startswith("cuda") and torch.cuda.is_available() else
             f", {torch.get_num_threads()} torch threads"), flush=True)
    parts = (("mnist", "synthetic", "satellite", "profile", "tri", "svi") if args.part == "all"
             else (args.part,))
    if args.part != "mnist":  # short fits of timed steps: their fit warnings are noise
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
    for part in parts:
        t0 = time.perf_counter()
        {"mnist": run_mnist, "synthetic": run_synthetic, "satellite": run_satellite,
         "profile": run_profile, "tri": run_tri, "svi": run_svi}[part](args)
        print(f"[{part}: {time.perf_counter() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
