"""gpinfer's torch backend on a GPU (issue "The scalable methods on a GPU"): three measurements.

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
per class, batches of 1000, ``--epochs`` 2 on the device: the time of epoch 2 (epoch 1 holds the
warm-up) per epoch and per batch, and the peak GPU memory of each N (it should not depend on N:
only a batch is moved to the device). Then the same problem with numpy on one CPU core (one
BLAS thread): ``--cpu-batches`` 200 batches of 1000 (a subset of 200 000 points; the per-batch
cost of sep does not depend on N), two epochs, epoch 2 timed, extrapolated to N / 1000 batches
(the output says so), and the speed-up per batch.

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
``--compile default`` counts sep's compiled step (its ``compile`` option; epoch 1 compiles).

``all`` runs the four in turn. ``--smoke`` shrinks everything (MNIST 2000 / 500 points, M = 20,
batches of 256, 20 s, evaluations every 2 s; synthetic N = 10^4 and 2 x 10^4, M = 20, 20 numpy
batches; Satellite N = 644, M = 64) so that ``all --smoke --device cpu`` runs on torch-CPU in
about two minutes.
Human-readable lines on stdout, one JSON line per measurement appended to ``--out``
(``outputs/gpu_backend.jsonl``).

GPU session plan (both scripts, one lease, about 20-25 minutes of device time)
------------------------------------------------------------------------------
Here, once (nothing can be fetched on the GPU machine; ``../shared`` does not travel)::

    echo /.gpu/ >> .git/info/exclude
    mkdir -p .gpu/data && cp ../shared/data/mnist.npz .gpu/data/        # 20 MB
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d .gpu/whl array-api-compat==1.16.0

Then five ``run`` calls (``carry: [".gpu"]``; each well inside the 10-minute call limit), on
the same warm machine if possible. python3 there holds CUDA torch 2.11, gpytorch 1.15, numpy,
scipy, scikit-learn, threadpoolctl; gpinfer and its ep plugin are installed (a copy, with their
entry points, which is how ``method="sep"`` is found) by this prefix of every call, ~15 s::

    python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation \
        --target /tmp/site .gpu/whl/*.whl . plugins/gpinfer-ep || exit 1
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1

followed by::

    # 1. ~1.5 min: plumbing check on the GPU (tiny sizes, both scripts)
    python3 benchmarks/gpu_backend.py all --smoke --device cuda --out $OUT/smoke.jsonl &&
    python3 benchmarks/gpu_gpytorch_svgp.py --smoke --device cuda --out $OUT/smoke.jsonl
    # 2. ~5 min: gpinfer sep on MNIST, float32, 150 s of training (+ evaluations, set-up)
    python3 benchmarks/gpu_backend.py mnist --data .gpu/data/mnist.npz --out $OUT/gpu.jsonl
    # 3. ~4 min: GPyTorch SVGP on MNIST, same card, same data, 150 s of training
    python3 benchmarks/gpu_gpytorch_svgp.py --data .gpu/data/mnist.npz --out $OUT/gpu.jsonl
    # 4. ~3-4 min: synthetic N = 1e5 and 1e6 on the GPU, 2 x 200 numpy batches on one core
    python3 benchmarks/gpu_backend.py synthetic --out $OUT/gpu.jsonl
    # 5. ~3 min: Satellite-sized full-batch iterations (sep, ep), GPU vs numpy on one core
    python3 benchmarks/gpu_backend.py satellite --out $OUT/gpu.jsonl

(Steps 4 and 5 may share one call. Each call's ``$OUT/gpu.jsonl`` comes back; the stdout lines
are the report.) Optional if time is left (~5 min each): ``gpu_backend.py mnist --lr 1e-2`` when
step 2 misses 2.1 % in 60 s (Adam's step was not tuned for batches of 1024 on a GPU),
``gpu_backend.py mnist --dtype float64``, ``gpu_gpytorch_svgp.py --lengthscale-init
sqrt-median``.

What each number checks (issue targets)
---------------------------------------
* step 2: sep M = 200 on MNIST reaches test error <= 2.1 % and NLL <= 0.075 within 60 s of
  training (the ``within 60 s`` line);
* steps 2 + 3: sep's time to 2.65 % test error is below GPyTorch SVGP's on the same card (the
  issue author measured 41 s for GPyTorch on an H100; step 3 re-measures it here);
* step 5: one Satellite-sized batch iteration (N = 6435, D = 36, C = 6, M = 644 per class) on
  the GPU takes < 1 s;
* step 4: one sep epoch at N = 10^6 (D = 20, C = 10, M = 100, batches of 1000) on the GPU is
  >= 20 x faster than on one CPU core with numpy (extrapolated from 200 measured batches), and
  the peak GPU memory at N = 10^5 and 10^6 is the same (it does not grow with N).

Here (no GPU), the smoke test on torch-CPU::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/gpu_backend.py all --smoke --device cpu \
        --torch-threads 1
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

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
    D, C, B = 20, 10, 1000
    M = min(args.synthetic_M, 20) if args.smoke else args.synthetic_M
    sizes = [10_000, 20_000] if args.smoke else [int(float(s)) for s in args.sizes.split(",")]
    cpu_batches = min(args.cpu_batches, 20) if args.smoke else args.cpu_batches
    opts = {"adam_learning_rate": 1e-3}
    settings = torch_settings(args)
    import torch

    X, y = synthetic(max(sizes), D, C)
    dev_rows = []
    for N in sizes:
        cuda_reset(args)
        t = epoch_times(sep(M, D, B, args.epochs, opts, settings), X[:N], y[:N])
        peak = cuda_peak_mb(args)
        nb = math.ceil(N / B)
        timed = t[1:] if len(t) > 1 else t
        per_epoch = float(np.mean(timed))
        row = {"N": N, "epoch_s": per_epoch, "batch_ms": 1e3 * per_epoch / nb,
               "epoch_times_s": t, "peak_gpu_mb": peak}
        dev_rows.append(row)
        print(f"  sep on {args.device} {args.dtype}: N={N:>8d} D={D} C={C} M={M} B={B}: epoch "
              f"{per_epoch:.2f} s ({row['batch_ms']:.2f} ms/batch; epoch 1 with warm-up "
              f"{t[0]:.2f} s)" + (f", peak GPU memory {peak:.1f} MB" if peak is not None
                                  else ""), flush=True)
    # numpy on one core: a subset of cpu_batches batches, two epochs, the second timed
    n_cpu = min(cpu_batches * B, max(sizes))
    with threadpool_limits(limits=1):
        t = epoch_times(sep(M, D, B, 2, opts, {}), X[:n_cpu], y[:n_cpu])
    cpu_batch = t[-1] / math.ceil(n_cpu / B)
    big = dev_rows[-1]
    nb = math.ceil(big["N"] / B)
    speedup = cpu_batch / (big["batch_ms"] / 1e3)
    print(f"  sep numpy, one core (1 BLAS thread): {1e3 * cpu_batch:.1f} ms/batch, measured on "
          f"{math.ceil(n_cpu / B)} batches (epoch 2 of a {n_cpu}-point subset) and extrapolated "
          f"to an epoch of N={big['N']}: {cpu_batch * nb:.1f} s")
    print(f"== synthetic: epoch at N={big['N']}: {args.device} {big['epoch_s']:.2f} s vs numpy "
          f"one core {cpu_batch * nb:.1f} s (extrapolated): speed-up {speedup:.1f} x "
          f"(target >= 20 x)")
    peaks = [r["peak_gpu_mb"] for r in dev_rows]
    if all(p is not None for p in peaks):
        print("   peak GPU memory by N: "
              + ", ".join(f"N={r['N']}: {r['peak_gpu_mb']:.1f} MB" for r in dev_rows)
              + f" (max / min {max(peaks) / min(peaks):.3f}; independent of N if ~1)")
    append_jsonl(args.out, {
        "part": "synthetic", "library": "gpinfer-sep", "time": time.time(),
        **device_info(torch, args.device), "dtype": args.dtype, "D": D, "C": C, "M": M,
        "batch_size": B, "smoke": args.smoke, "device_runs": dev_rows,
        "numpy_one_core": {"batch_ms": 1e3 * cpu_batch, "batches_measured":
                           math.ceil(n_cpu / B), "epoch_s_extrapolated": cpu_batch * nb,
                           "extrapolated_to_N": big["N"]},
        "speedup_per_batch": speedup})


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
def run_profile(args: argparse.Namespace) -> None:
    """Per step of sep (MNIST size: D 784, C 10, M ``--M`` per class, batches of
    ``--batch-size``; a step with its optimiser update, ``--read-every`` steps read together)
    and of svi (robust-max, the same sizes, M shared; a step with its optimiser update, values
    and checks read once per reported iteration of ``--read-every`` steps): aten operators,
    host syncs and, on CUDA, kernel launches and GPU busy time
    (``gpinfer.testing.step_profile``). Each line also gives the counts of one window of
    ``--read-every`` steps with its read. MNIST-like random pixels; ``--smoke``: M 20, batches
    of 256."""
    import torch
    from gpinfer_svi.method import SVI

    from gpinfer.testing.step_profile import profile_steps
    from gpinfer.training.minibatch import MiniBatchSchedule

    D, C = 784, 10
    M, B = (20, 256) if args.smoke else (args.M, args.batch_size)
    k = int(args.read_every)
    n = 4 * k * B
    rng = np.random.default_rng(0)
    T = rng.uniform(size=(C, D)) ** 4
    y = rng.integers(0, C, n)
    X = np.clip(T[y] + 0.3 * rng.normal(size=(n, D)), 0, 1) * (rng.uniform(size=(n, D)) < 0.2)
    cuda = args.device.startswith("cuda")
    settings = torch_settings(args)

    def fit_sep() -> None:
        est = sep(M, D, B, 2, {"adam_learning_rate": 1e-3, "compile": args.compile,
                               "read_every": k}, settings)
        est.set_params(baseline_failure="warn").fit(X, y)  # two epochs: counts, not a model

    def fit_svi() -> None:
        GPClassifier(method="svi", M=M, kernel=make_kernel("rbf", D, ard=True),
                     likelihood="robustmax", max_iter=3, batch_size=B, random_state=0,
                     method_options={"optimizer": "adam", "report_every": k,
                                     "optimizer_options": {"learning_rate": 1e-3}},
                     baseline_failure="warn", **settings).fit(X, y)

    # sep: the windows of epoch 2 (k steps each); svi: its second reported iteration
    for name, fit, owner, target, first, per in (
            ("sep", fit_sep, MiniBatchSchedule, "_group", 4 + 1, k),
            ("svi", fit_svi, SVI, "_step", k + 1, 1),
            ("svi-window", fit_svi, MiniBatchSchedule, "_group", 2, k)):
        counts = profile_steps(fit, owner, target, first=first, steps=3 if per == 1 else 2,
                               cuda=cuda)
        per_step = {key: v / per for key, v in counts.items() if key != "steps_profiled"}
        mode = f" compile={args.compile}" if name == "sep" else ""
        print(f"== profile {name} step on {args.device} {args.dtype}{mode} (D={D} C={C} M={M} "
              f"B={B} read every {k}): per step "
              + ", ".join(f"{key} {v:.2f}" for key, v in per_step.items())
              + (f"; per window of {k}: host_syncs {counts['host_syncs']:.0f}"
                 if per > 1 else ""), flush=True)
        append_jsonl(args.out, {
            "part": "profile", "library": f"gpinfer-{name}", "time": time.time(),
            **device_info(torch, args.device), "dtype": args.dtype, "D": D, "C": C, "M": M,
            "batch_size": B, "smoke": args.smoke, "read_every": k,
            "compile": args.compile if name == "sep" else "none", **per_step})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("mnist", "synthetic", "satellite", "profile", "all"))
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
    g = ap.add_argument_group("synthetic")
    g.add_argument("--sizes", default="1e5,1e6", help="N values (the last one is compared)")
    g.add_argument("--synthetic-M", type=int, default=100)
    g.add_argument("--epochs", type=int, default=2, help="epochs on the device (2..: timed)")
    g.add_argument("--cpu-batches", type=int, default=200,
                   help="numpy batches per epoch (one core), extrapolated to N")
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
    parts = (("mnist", "synthetic", "satellite", "profile") if args.part == "all"
             else (args.part,))
    for part in parts:
        t0 = time.perf_counter()
        {"mnist": run_mnist, "synthetic": run_synthetic, "satellite": run_satellite,
         "profile": run_profile}[part](args)
        print(f"[{part}: {time.perf_counter() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
