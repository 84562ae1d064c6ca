"""Step cost of the training engine (issue "One training engine"), in one run, one BLAS thread.

1. This machine's one-thread dgemm rate (process-CPU clock, as the step times).
2. One SEP mini-batch step at MNIST size (D = 784, C = 10, M = 200 per class, batches of 200,
   Adam; synthetic MNIST-like pixels, N = 4000): process-CPU time per step over epochs 2..E
   (epoch 1 is the warm-up), and its ratio to the *dgemm floor*, the time the step's 4.14 GFLOP
   of algebra would take at the dgemm rate (FLOP model of ``../shared/peers/profile_step.py``:
   per class ``17.33 M^3 + 7 M^2 B + 3 M^2 D + 4 M B D``).
3. Where the step's time goes: process-CPU time per step of its phases (kernel terms, site
   update, log Z_q and matrix gradients, kernel VJPs, optimiser step, the rest; over epochs
   2..E as the step, since s38: before, they averaged all epochs, the warm-up's fresh pages
   included, which is how a fault cost of epoch 1 was once read as the steady step's).

   Fresh pages (s38-kalloc, 2026-12-05, one thread, process CPU, load 4.5-8). numpy asks for
   transparent huge pages (``madvise(MADV_HUGEPAGE)``) on each allocation of 4 MiB or more,
   and this machine runs THP with ``defrag=madvise``, so the first touch of a fresh array may
   pay synchronous compaction and zeroing. A fresh ``[C, M, D]`` array (12.5 MB) allocated
   while 8 others are held cost 25.9 ms in one run and 2.6 ms in the next with numpy's
   default (it depends on the system's memory fragmentation), 3.2-3.3 ms with
   ``NUMPY_MADVISE_HUGEPAGE=0`` (small pages, six times the faults). In the SEP step this
   cost falls on the warm-up epoch: the heap grows to its peak there, and afterwards glibc
   hands each freed array's memory to the next allocation, so epochs 2..E (what 2. times)
   take 0 minor page faults per step. First 20 steps against steps 21-60 of one fit (two
   fits): forward 46.4/40.2 vs 34.2/35.3 ms, step 162.4/151.7 vs 144.9/149.9 ms; with
   ``NUMPY_MADVISE_HUGEPAGE=0`` forward 35.9/35.7 vs 35.2/34.3, step 148.5/147.6 vs
   148.7/144.3. (A line profile of a fit's first epochs sees these faults: ``Z - shift``
   10.6 ms a call there, 1.1 ms on its own.) Measured and not kept: the forward's two ``[C, M, D]``
   arrays (``Zs = Z - shift``, kept for the VJP, and the scaled ``A``) in buffers the stacked
   family reuses across steps (fits bit-identical): the warm-up forward 47.4/42.4 ->
   43.1/35.5 ms, the steady state unchanged (steps alternating between reused and fresh
   buffers within one fit: forward 34.6 vs 34.8 ms; ``--parts sep --epochs 3``, processes
   alternating, load 5.3-7.8: without the buffers 157.4 / 152.7 / 154.6 ms, with them
   159.0 / 148.2 / 161.3): a first-epoch gain only, for an ownership rule (weak references
   to the covariances that borrow them) and two ``[C, M, D]`` buffers a fitted model would
   keep. Fusing the shift and the division into cache-sized blocks of
   each latent's rows (both passes 4.9 ms unblocked, 4.8-5.1 in blocks of 2^14..2^18 floats,
   one fit cycling the variants, load 7) was not taken: both are bound by memory either way.
   What a user can do: ``NUMPY_MADVISE_HUGEPAGE=0`` in the environment, set before numpy is
   imported, takes the fault cost off the first epoch, but the steady state is no faster
   (the same runs as above: 163.5 / 156.3 / 164.2 ms, small pages cost TLB misses instead):
   worth it for short fits where ``/sys/kernel/mm/transparent_hugepage/defrag`` says
   ``madvise``, not for long training.

   Passes over ``[C, M, D]`` cut instead (the same session, one fit alternating old and new
   code per call, process CPU, load 5-6): the VJP's first product is
   ``(diag(rA) - 2 G_uu) Zs`` written straight into the gradient (no pass forming ``rA Zs``):
   27.7 -> 26.2 ms per call (medians; fits move by 2e-14 at most). The step with both cuts
   (``--parts sep --epochs 3``, processes alternating with e0cf397, load 2.3-3.2): before
   144.8 / 144.7 / 143.6 ms, after 149.4 / 144.0 / 143.0 ms (VJP phase 32.3-32.5 ->
   29.3-31.2 ms): below the step's run-to-run noise. Measured and not taken:
   the forward's cross product as ``Xs As^T`` with its transpose read by the distances' first
   pass (no transposing pass of its own; bit-identical): 14.1 -> 11.6 ms at this size, but
   1.2-3x slower at others (D 64 and B 200 or 1797, D 20 and B 1000, B 1000 at D 784).
4. Operations per step on torch-CPU (float64): the aten operators one SEP step at MNIST size
   issues, counted with ``torch.profiler`` over a few steps of epoch 2 (``top-level``: operators
   not called from another aten operator, the proxy for kernel launches on a GPU; ``all``:
   nested ones too), and the host synchronisations among them (``aten::item``,
   ``aten::_local_scalar_dense``).
5. ``--parts compiled``: the torch-CPU float64 step of 2. and 4. eagerly and with
   ``compile="default"`` (``gpinfer.backend.compile``), one after the other: CPU ms per step
   (epoch 1, which compiles, left out) and aten operators per step.
6. digits (split 0, M = 100, batches of 200, Adam at 0.01): process-CPU time per step of sep
   (M per class), sep with ``shared_inducing`` (one Z and one kernel for every class), svi
   (robust-max; a kernel and M inducing inputs per latent, started at shared k-means centres)
   and svi with ``shared_inducing`` (one Z and one kernel for every latent, GPflow SVGP's
   model). For the ratio against GPflow's SVGP run ``../shared/peers/minibatch.py`` (it builds
   its own interleaved rounds of gpinfer, GPflow and GPyTorch; its svi is the vi-robustmax
   preset, M drawn per latent).
7. ``--parts floor``: the step's *call floor*, each dense LAPACK/BLAS call of one SEP step at
   MNIST size timed on its own at its size, batched over the classes as the step batches it
   (``[C, M, M]``, ``[C, M, B]``), times its count per step, summed (``call_floor``): the
   step's time above it is the code's overhead, the call floor's above the dgemm floor is the
   cost of small ``trsm``/``potrf``/``trtri`` calls at these sizes.
8. ``--parts necessary``: the *floor of the necessary calls* (``necessary_floor``), the
   argument for issue 25's CPU target ("at most 1.3x its dgemm floor"): the dense calls the
   SEP step's maths cannot do without, each timed in every way this machine offers at its
   size on one thread and the fastest kept, summed. Per class and step (M = B = 200):

   - kernel, D-sized (the model's ``3 M^2 D + 4 M B D``, the same as the code's): the Gram
     ``A A^T`` (``syrk``, ``M^2 D``) and the cross products ``Z X^T`` (``2 M B D``) of Kuu and
     Kuf, and their adjoints ``G_uu Z`` and ``G_uf X`` (general weights: no structure to use);
   - four Choleskys of four different matrices: Kuu (the step's hyper-parameters moved), the
     update's cavity ``I + a P_w`` on the old sites, the evaluation's ``q`` and cavity on the
     new ones; two inverses: ``B_q^-1`` enters the Kuu gradient as a matrix (``potri``), and
     ``B_cav^-1 A`` enters both gradients (``potri`` and one ``gemm`` beat two ``trsm`` at
     M = 200); one ``trtri`` of ``L`` (every product with ``L^-1`` then a ``trmm``);
   - five ``trmm`` of ``[M, M]``: the site sums moved onto the step's factor (a congruence:
     whitened sums kept and moved by ``T = L^-1 L'`` take three, ``T`` and ``T^T P T``; the
     code took four, ``Lam -> P_w -> Lam``, until s38 and now takes three) and the
     gradient's sandwich ``L^-T (.) L^-1`` (two); two ``trmm`` of ``[M, B]`` (``L^-1 Kuf``,
     ``L^-T X``), one ``trsm`` (the update's cavity variances), two ``gemm``
     ``[M, B] x [B, M]`` (new site sums, the cross term ``A (X + A diag b)^T``) and one
     ``[M, M] x [M, B]`` (``B_cav^-1 A``);
   - memory-bound, outside the FLOP model: Adam's update of the ``P ~ C M D = 1.57 M``
     parameters (seven vectors of P streamed once), the forward's read of Z and the
     gradient's write (one pass each over ``[C, M, D]``).

   Measured 2026-12-05 (one thread, dgemm 74.3 GFLOP/s, load 4-5): the necessary calls
   92.3 ms (3.56 GFLOP) and the memory-bound moves 15.0 ms (Adam 10.3), 107.4 ms in all =
   **1.93x the dgemm floor** (55.7 ms; the calls alone 1.66x). The excess is LAPACK at
   order 200: four ``potrf`` 9.3 ms (11.5 GFLOP/s, 1.4 ms at the dgemm rate), two ``potri``
   9.8 (10.8 GFLOP/s), ``trtri`` 3.0 (8.9 GFLOP/s, in two halves; LAPACK's own 3.7), the
   ``trsm`` 4.4 (18 GFLOP/s), five ``trmm`` 13.1 (31 GFLOP/s); the D-sized products run at
   42-64 GFLOP/s. So 1.3x (72 ms) is out of reach on one thread at M = 200 with LAPACK, even
   with no element-wise work at all. The step was 161 ms (2.90x) in the same run: 54 ms
   above this floor are element-wise passes (distances, ``exp``, weights, symmetrisations
   over ``[C, M, B]`` and ``[C, M, M]``, the ``[C, M, D]`` passes), fresh pages and Python.
   The model's 4.14 GFLOP against the calls' 3.56: the model counts ``17.33 M^3`` per class,
   the code's cubic calls ``9 M^3`` at BLAS's counts (four ``potrf`` 4/3, ``trtri`` 1/3, two
   ``potri`` 4/3, six ``trmm`` 6), and ``7 M^2 B`` against the calls' ``9 M^2 B``.
   Measured and not taken: the cross product as ``(X Z^T)^T`` is 2.9 ms faster as a call
   (9.9 vs 12.8 ms) but its transposed layout costs a transposing pass back (11.9 vs
   11.8 ms with it); ``potri`` as the halved ``trtri`` and ``lauum`` (4.8 vs 4.6 ms);
   ``symm`` and ``syr2k`` for the symmetric products (no faster than ``gemm``).

   Re-measured after s37-floor2 (2026-12-05, one thread, dgemm 74.6 GFLOP/s, load 5.6-6.4):
   the necessary calls 107.8 ms = **1.94x** (the same floor within noise; ``potri`` 9.7 ms
   for two). LAPACK against blocked alternatives at orders 50..400 (``[10, M, M]``, least of
   9 process-CPU times, load 4.6-7): a recursive blocked Cholesky (the halves, the panel by
   ``trsm``, the Schur update one batched product, LAPACK ``potrf`` at leaves of 48, 64 or
   100; equal to LAPACK to 1e-11 relative) is slower at every order from 100 on (M = 100:
   0.45 vs 0.40 ms; 200: 3.1 vs 2.1; 300: 8.8 vs 5.5; 400: 20.2 vs 11.5; at 50 equal), and
   ``potri`` beats the halved ``trtri`` and one ``gemm`` (or ``trmm``) of ``T^T T`` (M = 100:
   0.88 vs 1.25 ms; 200: 4.3 vs 5.5; 300: 11.8 vs 14.4; 400: 28.5 vs 33.9; at 50 equal):
   OpenBLAS's small ``potrf``/``trsm`` run no faster per FLOP than the whole (``potrf`` at
   order 100 8-9 GFLOP/s, at 200 11-12), so splitting adds calls and passes and takes nothing
   off; LAPACK is kept at every order and the floor's factorisation timings stand. Cut
   instead: copies around the calls (``ops.cho_inverse`` inverts one copy of the stack in
   place, 5.02 -> 4.45 ms per call; the gradient's sandwich runs in place on its operand,
   5.43 -> 4.11 ms): the evaluation phase 39.3 -> 38.9 ms per step (medians of 4-5 epochs
   alternating old and new in one run, load 5.8-6.5). The step in three interleaved rounds
   (``--parts sep --epochs 3``, load 6.4-9.3): main 167.3 / 166.2 / 163.4 ms, the branch
   165.9 / 166.6 / 165.8 ms (2.92-2.98x; phases: kernel terms 49, site update 30, log Z_q
   and matrix gradients 38-39, kernel VJPs 34-35, Adam 11, coordinates 4, rest 1.5 ms): the
   cut is below the step's run-to-run noise. Not taken: allocator settings (no ``mmap`` for
   large arrays: 170.7 / 168.6 vs 165.9 / 171.3 ms, no gain: the step's fresh arrays cost
   no page faults worth measuring), a finiteness check by one sum (0.43 vs 0.54 ms per
   ``[C, M, D]`` array: memory-bound either way).

   The parameter vector's path (s38-optvec, 2026-12-05): the loop packs into the vector it
   handed to ``hp.unpack(owned=True)`` the step before (``HyperParameters.pack(reuse=)``:
   ``Z`` are its views, only the kernel entries are written) and writes the gradient into the
   last one (``gradient(out=)``): no fresh ``[P]`` array per step; ``hp.size`` no longer
   sums the ``L M D``-entry free mask per call (~1 ms each in ``unpack`` and ``_ascend``).
   Three interleaved rounds (``--parts sep --epochs 3``, load 7.2-8.5): main 163.6 / 161.2 /
   164.7 ms, the branch 160.1 / 156.1 / 152.8 ms; coordinates/pack/unpack 4.0-6.2 ->
   0.7-0.8 ms (left: the kernel objects' ``get``/``set_unconstrained``, ~0.5 ms for the ten
   ``Sum`` kernels; the coordinates' scaling, 7850 entries, 0.02 ms: not worth fusing into
   Adam's pieces); Adam 10.5-12.4 ms, the seven-vector stream the floor counts.

   The site side (s38-white, 2026-12-05): sep's tied sums kept whitened between steps and
   moved to the step's factor by ``T = L^-1 L'`` (three ``trmm`` where ``Lam -> P_w -> Lam``
   took four; ``Lam``, ``h`` formed only when read, a snapshot holding the kept sums); the
   update's cavity moments without its means (``mu = R^T z``) and its new sums accumulated
   into ``keep * P_w`` by ``gemm`` with ``beta = 1``; the gradients in place on
   ``B_cav^-1 A`` and on the cross product (``w a^T``, ``w w^T`` rank-one ``gemm``); each
   ``B = I + a P_w`` checked finite once per phase and factorised in place
   (``ops.cholesky(overwrite=True)``); the update's sums and the sandwich symmetrised in
   place (``ops.symmetrize_``). Three interleaved rounds of ``--parts sep --epochs 3``
   (load 5.2-8.9; main with the parameter vector's path, the cuts without it), site update
   and log Z_q + gradients per step: main 29.4 / 28.8 / 25.3 and 39.0 / 38.2 / 35.2 ms; the
   update's cuts 25.1 / 24.9 / 21.4 (the gradients' phase unchanged); with the gradients in
   place 36.8 / 36.8 / 34.5; with the factorisations in place 22.5 / 21.8 / 20.7 and
   34.8 / 34.3 / 33.0; with the symmetrisations in place 22.4 / 21.1 / 20.6 and 34.2 / 33.0 /
   32.7. The merged branch against main (three rounds, load 4.5-5.2): step 143.4 / 140.5 /
   133.2 vs 145.5 / 150.4 / 139.4 ms, update 21.1 / 20.0 / 19.6 vs 25.2 / 27.1 / 24.4,
   log Z_q + gradients 33.5 / 31.9 / 31.0 vs 34.9 / 36.6 / 33.6. Line-profiled at load 2.3,
   the phases are near their calls: the rebase 6.9 ms (three ``trmm``, two of them on
   copies the kept sums need), the update's cavity ``trsm`` 4.1, its site ``gemm`` 3.4, the
   two ``potri`` 4.8 each with their copy and mirror, ``B_cav^-1 A`` 3.4, the cross term
   3.1, the sandwich 4.4. Left: ``potri`` in place on ``L_B`` (two ``[C, M, M]`` copies per
   evaluation; ``StackedGaussians`` would then lose the factor it exposes). torch-CPU:
   278 top-level aten ops per step (main 289.3): the snapshot holds the kept sums (no
   ``u``-space round trip and no copies per step), the cavity without ``w``.

   The kernel side and the checks (s39-seppass, 2026-12-05, one thread, process CPU): the
   cross product in the layout its shape favours (``transposed_cross``, item 10; the forward
   alone, old and new alternating in one process, 32.9 -> 30.3 ms, bit-identical); the
   VJP's ``var`` gradient from the weights' row sums (an RBF's ``dg/dr2 = -g/2``: no
   ``einsum`` over each matrix and ``dK``) and its weights in one pass fewer per matrix
   (30.2 -> 29.1 ms, gradients within 4.5e-15); ``ops.all_finite`` by a sum of squares
   (the step's checks 1.7-2.2 -> 1.5-1.6 ms). Three interleaved rounds of ``--parts sep
   --epochs 3`` (load 5.4-6.6): main 144.7 / 144.4 / 147.5 ms (2.67-2.74x), the branch
   134.7 / 139.0 / 144.5 ms (2.44-2.58x); kernel terms 44.5-45.4 -> 40.6-42.9, VJPs
   31.9-32.8 -> 29.2-32.1, rest 1.5-1.6 -> 0.9-1.2 ms. torch-CPU: 278 aten ops per step
   (unchanged: the device path is untouched). Measured and not kept: the forward's two
   divisions by ``ell`` over ``[C, M, D]`` as products with ``1 / ell`` (33.4 vs 32.6 ms:
   the passes are bound by memory, not by the division); the VJP's products, sums and
   scaling per class (25.7 -> 25.3 ms alone) or in column blocks that stay in L2 (31-35 ms:
   ``gemm`` on narrow blocks is slower); ``exp`` in place and the weights symmetrised in
   place (fresh arrays cost nothing extra in the steady step: glibc hands each freed
   array's memory to the next, 31.3 vs 30.8 ms); ``a2`` added by the transposing pass and
   ``-2`` folded into ``Xs`` (bit-identical, one ``[C, M, B]`` pass fewer: 30.7 vs 30.4 ms,
   not measurable). Adam is at numpy's floor for its chain: 9.9 ms per update against
   3.5-4.0 ms for three additions that move the same seven streams (caches flushed between
   calls), the difference being the 13 element-wise operations per parameter (``sqrt``
   and the division the costliest); the least any reordering needs is 12 (0.2-0.4 ms,
   other roundings), pieces of 8k-64k entries 9.7-10.7 ms (16k, the one used, the best).
   What stays above the floor of the necessary calls on the kernel side is numpy's one
   pass per operation over ``[C, M, D]`` (the mean, ``A = Zs / ell`` and ``As``: 4-5 ms;
   the VJP's two reductions against ``Zs`` and its scaling: 3-4 ms) and the passes over
   ``[C, M, M]`` / ``[C, M, B]`` (distances, ``exp``, weights: about 3 ms). s40-fused
   measured what a fused compiled kernel takes (``benchmarks/fused_step.py``: numba
   prototypes, equal to 2e-15): ~5 ms off the forward, nothing off the VJP (its element-wise
   work is already its ``[C, M, D]`` traffic), ~4 ms off Adam; a step of ~118-120 ms
   (2.16-2.20x), ~18 ms above the necessary calls' floor, which stays the bound.

   The site side, copies and mirrors (s39-sitepass, 2026-12-05, one thread, process CPU).
   Per call site in the steady step (ops wrapped, epochs 2..3, load 4): the two ``potri``
   9.4 ms with their copies and mirrors, six ``trmm`` 15.0 (three on copies: the rebase's
   ``T = L^-1 L'`` and ``P T``, and ``L^-1 Kuf``), the sandwich's ``symmetrize_`` 0.66.
   Cut: ``ops.symmetrize_`` one transposed copy per matrix, added and halved in cache (565
   -> 365 us at ``[10, 200, 200]``, 120 -> 83 at ``[10, 100, 100]``, bit-identical);
   ``ops.cho_inverse(overwrite=True)`` inverting the caller's own factors in place, the
   per-class evaluation's ``q`` forming ``B^-1`` in place of its factors
   (``StackedGaussians(consume=True)``, log-determinants taken first, bit-identical): the
   two together, steps alternating old and new in one fit, log Z_q + gradients 32.0 ->
   30.5 ms; the cavity's means and ``B^-1 A`` in one pass over the classes in place of its
   factors (``paired_by_inverse``: ``ops.cho_inverse_terms`` with one ``X`` per class,
   ``potri`` then ``symv`` / ``symm`` on one triangle in cache; no stack, no mirror; fits
   within 3.4e-15): 30.9 -> 30.0 ms in one fit (alone at ``[10, 200, 200]``: 7.0 -> 6.6
   ms; M = 100 1.62 -> 1.54; M = 50 0.37 -> 0.39); digits' ``sum_c B_c^-1`` summed in the
   inverses' Fortran order (``cho_inverse_terms``: 59 -> 28 us at M = 100, bit-identical).
   ``--parts sep --epochs 3``, processes alternating with main (5491e48), seven rounds,
   load 1.9-5.3: main 123.8 / 130.8 / 130.9 / 131.9 / 126.7 / 131.3 / 121.8 ms, the branch
   127.2 / 119.2 / 127.2 / 124.0 / 123.4 / 126.2 / 120.0 (2.33-2.46x the dgemm floor);
   log Z_q + gradients 30.1 / 32.3 / 31.8 / 31.9 / 30.7 / 30.5 / 29.5 -> 29.4 / 27.8 / 29.7
   / 28.1 / 28.3 / 28.7 / 27.9, the site update unchanged (18.4-20.3 vs 18.3-19.8).
   digits (``--parts digits-phases,digits --epochs 4``, two rounds, load 3.5-4.6): shared
   sep step 8.87 / 9.77 ms (main 9.75 / 9.72), q and cavity 3.18 / 3.48 (main 3.51 /
   3.54). torch-CPU: 278 aten ops per step (unchanged). Left, and why: the three copies
   under ``trmm`` are of arrays the caller does not own: the kept sums ``P`` (a snapshot
   holds them), ``L'`` (the step's terms keep it), ``Kuf`` (``HyperParameters``'
   covariances, cached per version and shared with the VJPs; consuming it would need an
   ownership rule in the kernel module: s40, below); ``q``'s mirror stays (its ``B^-1`` enters the
   gradient's unsymmetrised sum as a full matrix). The update phase is its calls (the
   rebase's three ``trmm`` 6.9 ms, the cavity's ``potrf`` and ``trsm`` 6.3, the site
   ``gemm`` 3.2).

   The hand-overs (s40-sepcpu, 2026-12-05, one thread, process CPU). ``Kuf`` is read by
   nobody after ``stacked_terms`` (the VJPs work on the kept ``g_uf`` and distances; svi
   reads it but forms no terms): the step's terms take it over
   (``StackedCovariances.take_Kuf``; a later ``Kuf`` read raises, a second take forms it
   again from ``g_uf``) and solve ``A = L^-1 Kuf`` in place (``trmm`` alone at
   ``[10, 200, 200]``: 1.90 / 1.86 -> 1.63 / 1.66 ms); ``Kuu`` plus the jitter, already a
   copy of the shared ``Kuu``, is factorised in place (``jittered_cholesky(again=)``: the
   rare escalation forms it again), where ``potrf``'s stack copied it once more. Both
   together, ``stacked_terms`` from cached covariances at MNIST size, main's and the
   branch's alternating ABBA in one process (load 4.2-4.4, medians of 30): 9.00 / 8.99 ->
   8.10 / 8.18 ms, bit-identical. digits' ``shared_paired`` inverts both Gaussians in place
   of their factors (``potri``'s wrapper copied each matrix; ``_inverted_pair`` now serves
   it and ``paired_by_inverse``): ABBA, 100 calls each, load 5.6-5.9: M = 100 4.58 / 4.72 /
   4.75 -> 4.56 / 4.48 / 4.57 ms, M = 200 18.42 -> 18.22, bit-identical. ``--parts sep
   --epochs 3``, processes alternating with main (6b36cd0), load 3.5-4.8: main 137.4 /
   134.8 / 138.1 ms, the branch 135.0 / 138.6 / 137.3 (kernel terms 41.9 / 43.1 / 42.4 vs
   42.3 / 41.7 / 40.8): the 0.8 ms are below the step's run-to-run noise at this load.
   digits (``--parts digits-phases,digits --epochs 4``, two rounds, load 4.0-4.2): sep
   21.46 / 20.45 -> 21.06 / 20.18 ms, shared sep 11.23 / 10.04 -> 9.85 / 9.64, its q and
   cavity 3.58 / 3.60 -> 3.49 / 3.37. torch-CPU: 278 aten ops per step (unchanged; on a
   device ``take_Kuf`` hands the array over and nothing is written in place).
   ``StackedGaussians.paired``'s numpy branch (two Gaussians) and
   ``project(by_inverse=True)`` had no library caller left: they are the tests' oracles
   (``tests/sites/test_stacked.py``: ``paired_reference``, ``project_by_inverse``),
   ``paired`` is the one ``[2, C]`` stack everywhere.
   Line-profiled (epochs 2..3, load 3.4), the rest of the step's copies are of arrays a
   later reader or a snapshot holds: the update cavity's ``[A, a h_w]`` (``A`` is the
   evaluation's), ``keep * P_w`` and the rebase's ``trmm`` operands (the kept sums, ``L'``),
   ``L^-1`` (``L`` is kept), ``q``'s mirror.

9. ``--parts digits-phases``: where digits' shared sep step (the model of 6. that GPflow's
   SVGP is timed against) goes: process-CPU ms per step of its phases and of the shared
   path's main calls (``PhaseClock``: ``cProfile`` inflates this step's many small calls, e.g.
   the argmax factors' tilted moments 0.4-0.5 ms per call there, 0.28-0.34 ms here with
   their masks). Measured 2026-12-05 (load 4.1): step 12.1 ms; update 5.0 (cavity moments
   2.2, site products 0.96, rebase 0.75, tilted slopes 0.34), log Z_q and gradients 5.3
   (q and cavity 4.0, summed gradients 0.78, tilted log Z 0.28), kernel terms 0.95, VJPs
   0.49, optimiser 0.23. After s38-sepdig (the update cavity's ``R`` and ``z`` one ``trsm``
   per class in place; the summed gradients' two ``[M, n] @ [n, M]`` products one), two
   rounds interleaved with main (``--parts digits-phases,digits --epochs 4``, load 1.7-2.1):
   step 9.85 / 10.06 ms (main 9.98 / 9.30: the rounds differ by more than the cuts); update
   4.14 / 4.18 (cavity moments 1.79 / 1.80, site products 0.86 / 0.86, rebase 0.68 / 0.69,
   tilted slopes 0.24 / 0.25), log Z_q and gradients 4.35 / 4.41 (q and cavity 3.45 / 3.47,
   summed gradients 0.55 / 0.58 against main's 0.65 / 0.59, tilted log Z 0.19 / 0.20),
   kernel terms 0.75 / 0.79, VJPs 0.37 / 0.40, optimiser 0.14 / 0.16. The step is now its
   LAPACK/BLAS calls of order ``M = 100`` (3 Cholesky stacks 1.3 ms, 2 ``potri`` passes with
   ``symv``/``symm`` 2.3, ``trsm`` 1.0, ``trmm`` 0.9, the site ``gemm`` 0.9, in-step
   ``PhaseClock``). Measured and not kept: the rebase ``T^T P_c T`` as two ``trmm`` over all
   classes on a ``[M, C, M]`` copy (0.73 ms in the step against 0.6 for the ``2 C`` calls:
   OpenBLAS's ``trmm`` is no faster on the wide matrix), and the site products added into
   ``keep * P_w`` by one ``gemm`` ``[C M, n] @ [n, M]`` with ``beta = 1`` (1.28 against
   0.90 ms for ``A @ [n, C M]`` and the strided sum).

   After s39-digrebase (the shared sums read in the frame they were made in,
   ``gpinfer.sites.stacked.Frame``: ``U = L^-1 L_o``, ``Q = U^T U`` and ``U^T A`` of the one
   latent and three ``trmm`` moving the summed gradients' terms, where the rebase took ``2 C``
   ``trmm``; moved only when ``||Q - I||_F > 0.5``, 7 of 71 steps in 8 epochs here; the update's
   new sums not symmetrised on numpy), two rounds interleaved with main (this part with
   ``digits``, ``--epochs 4``, load 3.9-5.5): step 10.54 / 10.26 ms (main 10.80 / 11.13),
   digits' ``sep_shared`` 10.03 / 10.37 (main 10.24 / 11.54); update 4.02 / 3.91 (main
   4.47 / 4.62; the kept sums 0.30 / 0.29 against the rebase's 0.72 / 0.75), log Z_q and
   gradients 4.87 / 4.77 (main 4.69 / 4.79; summed gradients 0.77 / 0.74 against 0.63 / 0.64:
   the frame's three ``trmm``). In one process, fits alternating the frame off
   (``FRAME_DRIFT = 0``: main's rebase every step) and on (load 3.5): update 4.29 / 4.15 /
   4.05 -> 3.85 / 3.68 / 3.66 ms, log Z_q and gradients 4.34 / 4.42 / 4.26 -> 4.73 / 4.52 /
   4.53, step 10.00 / 9.90 / 9.58 -> 10.08 / 9.53 / 9.53. Measured and not taken: ``Q`` by
   LAPACK ``lauum`` (23 against 47 us); the per-class sums in frames (``U``, ``Q``, ``U^T A``
   and the gradients' moves per class: 4.6 ms against the rebase's 1.5 at ``C = 10``,
   ``M = 100``, ``n = 200``; 20.0 against 8.5 at ``M = 200``), so they keep the rebase;
   ``B = Q + a P`` per class in cache (61 against 50 us for the stack). Left: the step is its
   LAPACK/BLAS calls (the update's cavity ``potrf`` + ``trsm`` 1.9 ms, the evaluation's two
   ``potrf`` and two ``potri`` passes 3.6, the site ``gemm`` 0.9); ``ops.symmetrize_`` (the
   per-class sandwich's) would take 75 instead of 124 us at ``[10, 100, 100]`` with one
   transposed copy per matrix (bit-identical).

10. ``--parts cross``: the stacked kernel path's cross product ``-2 As Xs^T`` ``[C, M, B]``
    on numpy in both layouts (``As Xs^T`` over the ``C M`` rows, or ``Xs As^T`` ``[B, C M]``
    transposed by the distances' first pass), forced, over ``M`` 50..400, ``B`` 50..1000,
    ``D`` 32..784 (``C = 10``; median process CPU, the two alternating, 32 MB written between
    calls): the data of ``gpinfer.kernels.stacked.transposed_cross``, which picks the
    transposed form where ``D >= max(256, 2 B)``. Measured 2026-12-05 (s39-seppass, load
    3.2-4.6, two runs of the 144 shapes): inside the rule 0.68-0.98 of the time where the
    product costs 4 ms or more, at most 4 % more at smaller ones; outside it up to 2.3x
    (``D = 32``, ``B = 1000``). At MNIST size 13.8 -> 11.6 and 17.4 -> 12.6 ms (the product
    alone 13.2 -> 10.1 ms; the transposing pass 0.9 ms where the in-place one takes 0.45).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/engine_step.py [--epochs 3]
        [--parts sep,floor,necessary,ops,compiled,digits,digits-phases,cross]
        [--peers ~/peers-venv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

N, D, C, M, B = 4000, 784, 10, 200, 200


def step_flops(M: int = M, B: int = B, D: int = D, C: int = C) -> float:
    """FLOP of one SEP step (the issue's model, all classes)."""
    return C * (17.33 * M**3 + 7 * M**2 * B + 3 * M**2 * D + 4 * M * B * D)


def mnist_like(seed: int = 0, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sparse-ish pixel rows in [0, 1] around class templates (as profile_step.py)."""
    rng = np.random.default_rng(seed)
    T = rng.uniform(size=(C, D)) ** 4
    y = rng.integers(0, C, n)
    X = np.clip(T[y] + 0.3 * rng.normal(size=(n, D)), 0, 1) * (rng.uniform(size=(n, D)) < 0.2)
    return X, y


class PhaseClock:
    """Process-CPU time spent in named methods (wrapped for the duration of a ``with``)."""

    def __init__(self, targets: dict[str, tuple[object, str]]):
        self.targets = targets
        self.spent: dict[str, float] = defaultdict(float)
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> PhaseClock:
        for label, (owner, name) in self.targets.items():
            original = getattr(owner, name)
            self._saved.append((owner, name, original))

            def timed(*args, _f=original, _label=label, **kwargs):
                t0 = time.process_time()
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.spent[_label] += time.process_time() - t0

            setattr(owner, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)


def fit_steps(X, y, method: str, M_: int, batch: int, epochs: int, options: dict,
              likelihood: str | None = None, kernel=None, settings: dict | None = None,
              after_warm_up: Callable[[], object] | None = None) -> dict[str, object]:
    """CPU seconds per mini-batch step over epochs 2..epochs (callback marks per epoch) and the
    fitted estimator (``settings``: more estimator parameters, e.g. the array backend;
    ``after_warm_up``: called at the end of epoch 1, e.g. to restart a ``PhaseClock``, so that
    phases and steps cover the same epochs: epoch 1 pays the heap's fresh pages)."""
    from gpinfer.estimator import GPClassifier

    marks: list[float] = []
    steps_per_epoch = -(-X.shape[0] // batch)
    opts = dict(options)
    if method == "svi":
        opts["report_every"] = steps_per_epoch  # one report per epoch
    est = GPClassifier(method=method, M=M_, kernel=kernel or "rbf", likelihood=likelihood,
                       max_iter=epochs, batch_size=batch, random_state=0, method_options=opts,
                       **(settings or {}))
    def mark(info: object) -> None:
        if not marks and after_warm_up is not None:
            after_warm_up()
        marks.append(time.process_time())

    est.fit(X, y, callback=mark)
    per_step = (marks[-1] - marks[0]) / ((len(marks) - 1) * steps_per_epoch)
    return {"step_cpu_s": per_step, "epochs_timed": len(marks) - 1, "model": est}


def sep_step_phases() -> dict[str, tuple[object, str]]:
    """The SEP step's phases for ``PhaseClock``: name -> (owner, method), in step order."""
    from gpinfer_ep.method import SparseSites

    from gpinfer.hyper import HyperParameters
    from gpinfer.optim.adam import Adam
    from gpinfer.training.loop import TrainingLoop

    return {"kernel terms (Kuu, Kuf, chol, A)": (SparseSites, "prepare"),
            "site update": (SparseSites, "update"),
            "log Z_q + matrix gradients": (SparseSites, "objective"),
            "kernel VJPs (hp.gradient)": (HyperParameters, "gradient"),
            "Adam step": (Adam, "step_into"),
            "optimiser coordinates, pack/unpack": (TrainingLoop, "_ascend"),
            "one step, all of it": (TrainingLoop, "_step")}


def sep_step_split(spent: dict[str, float], n_steps: int) -> dict[str, float]:
    """Seconds per step of ``sep_step_phases``' phases from a ``PhaseClock``'s ``spent`` over
    ``n_steps`` steps: the optimiser's coordinates without Adam (``_ascend`` holds the Adam
    step), and the rest of the step without its four phases (``_step`` holds them)."""
    split = {k: v / n_steps for k, v in spent.items()}
    split["optimiser coordinates, pack/unpack"] -= split["Adam step"]
    inner = ("kernel terms (Kuu, Kuf, chol, A)", "site update", "log Z_q + matrix gradients",
             "kernel VJPs (hp.gradient)")
    split["rest of the step (Python, checks)"] = (split.pop("one step, all of it")
                                                  - sum(split[k] for k in inner))
    return split


def sep_mnist_size(epochs: int, rate: float) -> dict[str, object]:
    from gpinfer.kernels import make_kernel

    X, y = mnist_like()
    phases = sep_step_phases()
    with PhaseClock(phases) as clock:
        out = fit_steps(X, y, "sep", M, B, epochs, {"adam_learning_rate": 1e-3},
                        kernel=make_kernel("rbf", D, ard=True), after_warm_up=clock.spent.clear)
    n_steps = (epochs - 1) * -(-N // B)  # epochs 2..: the clock restarted after epoch 1
    split = sep_step_split(clock.spent, n_steps)
    floor = step_flops() / rate
    return {"step_cpu_ms": 1e3 * out["step_cpu_s"], "floor_ms": 1e3 * floor,
            "ratio_to_floor": out["step_cpu_s"] / floor,
            "achieved_gflops": step_flops() / out["step_cpu_s"] / 1e9,
            "phases_ms_per_step (epochs 2..)": {k: round(1e3 * v, 1) for k, v in split.items()}}


def _stand_ins(M_: int = M, B_: int = B, D_: int = D, C_: int = C) -> dict[str, np.ndarray]:
    """Well-conditioned random stand-ins of the step's arrays, in the code's shapes and memory
    layout: ``Z [C, M, D]``, ``X [B, D]``, an SPD stack ``K [C, M, M]``, its factor ``L`` and
    ``L^-1``, ``[C, M, B]`` arrays ``Kuf``, ``G`` and a ``[C, M, D]`` accumulator."""
    from gpinfer.backend import ops

    rng = np.random.default_rng(1)
    S = rng.normal(size=(C_, M_, M_)) / np.sqrt(M_)
    K = S @ ops.mT(S) + 2.0 * np.eye(M_)  # SPD [C, M, M]
    L = np.linalg.cholesky(K)
    return {"Z": rng.normal(size=(C_, M_, D_)), "X": rng.normal(size=(B_, D_)), "K": K,
            "L": L, "L_inv": ops.tri_inverse(L), "Kuf": rng.normal(size=(C_, M_, B_)),
            "G": rng.normal(size=(C_, M_, B_)), "W": rng.normal(size=(C_, M_, D_))}


def _call_list(M_: int = M, B_: int = B, D_: int = D, C_: int = C
               ) -> list[tuple[str, int, float, Callable[[], object]]]:
    """The SEP step's dense LAPACK/BLAS calls as the numpy code issues them, batched over the
    ``C`` classes as the step batches them: ``(name, calls per step, FLOP per call, thunk)``.

    Read from the code of one step (``kernels.stacked._forward``/``_vjp``,
    ``sites.stacked``, ``gpinfer_ep.state._tied_sums``/``_tied_evaluate``): prepare (the
    distance products, Kuu's Cholesky, its ``trtri``, ``A = L^-1 Kuf``; products with a triangular
    factor are ``trmm``: ``ops.tri_matmul``), update (the kept whitened sums moved to the
    step's factor, ``T = L^-1 L'`` and ``T^T P_w T``, the cavity's Cholesky and projection,
    the new site sums),
    evaluate (two Cholesky, both ``B^-1`` by ``potri``, ``B_cav^-1 A`` one product with the
    cavity's, the cross terms one product ``A (X + A diag B)^T``, the gradient sandwich and
    ``L^-T X``), VJPs (``G_uu Zs`` and ``G_uf Xs`` accumulated in place: ``ops.matmul_add_``).
    Counted by FLOP as the BLAS call does them (a ``trmm`` ``M^2 k``, the Gram ``A A^T``, which
    numpy runs as ``syrk``, ``M^2 D``).
    """
    from gpinfer.backend import ops

    a = _stand_ins(M_, B_, D_, C_)
    Z, X, K, L, Linv, Kuf, G, W = (a[k] for k in ("Z", "X", "K", "L", "L_inv", "Kuf", "G",
                                                   "W"))
    mm, mb, mmd = 2.0 * M_**3, 2.0 * M_**2 * B_, 2.0 * M_**2 * D_
    Zr = Z.reshape(C_ * M_, D_)
    return [
        ("distance syrk A A^T [C,M,D]x[C,D,M]", 1, C_ * mmd / 2, lambda: Z @ ops.mT(Z)),
        ("distance gemm [CM,D]x[D,B]", 1, C_ * 2.0 * M_ * B_ * D_, lambda: Zr @ X.T),
        ("potrf [C,M,M] (Kuu, B_cav x2, B_q)", 4, C_ * M_**3 / 3,
         lambda: np.linalg.cholesky(K)),
        ("trtri [C,M,M] (L^-1)", 1, C_ * M_**3 / 3, lambda: ops.tri_inverse(L)),
        ("potri [C,M,M] (B_q^-1, B_cav^-1)", 2, C_ * 2 * M_**3 / 3,
         lambda: ops.cho_inverse(L)),
        ("trmm [C,M,M]x[C,M,M] (the sums' T, T^T P_w T; the sandwich)", 5, C_ * mm / 2,
         lambda: ops.tri_matmul(L, K, right=True)),
        ("trsm [C,M,M]\\[C,M,B] (the update's projection)", 1, C_ * M_**2 * B_,
         lambda: ops.solve_triangular(L, Kuf)),
        ("trmm [C,M,M]x[C,M,B] (L^-1 Kuf, L^-T X)", 2, C_ * mb / 2,
         lambda: ops.tri_matmul(Linv, Kuf)),
        ("gemm [C,M,M]x[C,M,B] (B_cav^-1 A)", 1, C_ * mb, lambda: K @ Kuf),
        ("gemm [C,M,B]x[C,B,M] (site sums, A (X + A diag B)^T)", 2, C_ * mb,
         lambda: Kuf @ ops.mT(G)),
        ("VJP gemm [C,M,M]x[C,M,D] (W -= 2 G_uu Zs, in place)", 1, C_ * mmd,
         lambda: ops.matmul_add_(W, K, Z, -2.0)),
        ("VJP gemm [CM,B]x[B,D] (W -= G_uf Xs, in place)", 1, C_ * 2.0 * M_ * B_ * D_,
         lambda: ops.matmul_add_(W, G, X, -1.0)),
    ]


def _necessary_calls(M_: int = M, B_: int = B, D_: int = D, C_: int = C
                     ) -> list[tuple[str, int, float, dict[str, Callable[[], object]]]]:
    """The dense calls the SEP step's maths needs, each with the ways this machine can run it:
    ``(name, calls per step, FLOP per call, {way: thunk})`` (see ``necessary_floor``)."""
    from scipy.linalg import blas, lapack

    from gpinfer.backend import ops

    a = _stand_ins(M_, B_, D_, C_)
    Z, X, K, L, Linv, Kuf, G, W = (a[k] for k in ("Z", "X", "K", "L", "L_inv", "Kuf", "G",
                                                   "W"))
    mm, mb, mmd = 2.0 * M_**3, 2.0 * M_**2 * B_, 2.0 * M_**2 * D_
    Zr, Gr = Z.reshape(C_ * M_, D_), G.reshape(C_ * M_, B_)
    from gpinfer.optim.adam import Adam

    P = C_ * M_ * D_ + C_ * (D_ + 1)  # the inducing inputs and the ARD kernels
    rng = np.random.default_rng(2)
    theta, grad = rng.normal(size=P), rng.normal(size=P)
    adam = Adam(1e-3)
    adam.reset(theta)
    shift, scale, Z2 = rng.normal(size=D_), rng.normal(size=(C_, 1, D_)), np.empty_like(Z)

    def per_class(f: Callable[[int], object]) -> Callable[[], object]:
        return lambda: [f(c) for c in range(C_)]

    def potrf_in_place() -> None:
        out = K.copy()
        for c in range(C_):
            lapack.dpotrf(out[c].T, lower=0, overwrite_a=1, clean=0)

    return [
        ("Kuu distances A A^T (M^2 D)", 1, C_ * mmd / 2,
         {"numpy A @ A^T (syrk)": lambda: Z @ np.swapaxes(Z, 1, 2),
          "dsyrk per class": per_class(lambda c: blas.dsyrk(1.0, Z[c].T, trans=1))}),
        ("Kuf distances [CM,D]x[D,B]", 1, C_ * 2.0 * M_ * B_ * D_,
         {"Z X^T": lambda: Zr @ X.T, "(X Z^T)^T": lambda: X @ Zr.T,
          "dgemm Fortran": lambda: blas.dgemm(1.0, X.T, Zr.T, trans_a=1)}),
        ("VJP G_uu Zs (2 M^2 D)", 1, C_ * mmd,
         {"numpy stack": lambda: K @ Z, "in place": lambda: ops.matmul_add_(W, K, Z, -2.0),
          "dsymm per class": per_class(lambda c: blas.dsymm(1.0, K[c], Z[c].T, side=1))}),
        ("VJP G_uf Xs [CM,B]x[B,D]", 1, C_ * 2.0 * M_ * B_ * D_,
         {"G X": lambda: Gr @ X, "in place": lambda: ops.matmul_add_(W, G, X, -1.0),
          "(X^T G^T)^T": lambda: X.T @ Gr.T}),
        ("potrf [C,M,M] (Kuu, B_cav old and new sites, B_q)", 4, C_ * M_**3 / 3,
         {"np.linalg.cholesky": lambda: np.linalg.cholesky(K), "dpotrf in place": potrf_in_place}),
        ("trtri [C,M,M] (L^-1, for every product with L)", 1, C_ * M_**3 / 3,
         {"in two halves (ops)": lambda: ops.tri_inverse(L),
          "dtrtri": per_class(lambda c: lapack.dtrtri(L[c], lower=1))}),
        ("potri [C,M,M] (B_q^-1 of the gradient, B_cav^-1)", 2, C_ * 2 * M_**3 / 3,
         {"dpotri": lambda: ops.cho_inverse(L)}),
        ("trmm [C,M,M]^2 (sites to the new factor x3, gradient sandwich x2)", 5, C_ * mm / 2,
         {"trmm": lambda: ops.tri_matmul(L, K, right=True), "gemm": lambda: L @ K}),
        ("trsm [C,M,M]\\[C,M,B] (the update's cavity projection)", 1, C_ * M_**2 * B_,
         {"trsm": lambda: ops.solve_triangular(L, Kuf),
          "trtri + trmm": lambda: ops.tri_matmul(ops.tri_inverse(L), Kuf)}),
        ("trmm [C,M,M]x[C,M,B] (L^-1 Kuf, L^-T X)", 2, C_ * mb / 2,
         {"trmm": lambda: ops.tri_matmul(Linv, Kuf), "gemm": lambda: Linv @ Kuf}),
        ("gemm [C,M,M]x[C,M,B] (B_cav^-1 A)", 1, C_ * mb,
         {"gemm": lambda: K @ Kuf, "symm": per_class(lambda c: blas.dsymm(1.0, K[c], Kuf[c]))}),
        ("gemm [C,M,B]x[C,B,M] (new site sums, A (X + A diag B)^T)", 2, C_ * mb,
         {"gemm": lambda: Kuf @ np.swapaxes(G, 1, 2)}),
        # memory-bound, no FLOP in the model: the P = C M D + ... parameters move each step
        ("Adam update of the P parameters (7 vectors of P streamed once)", 1, 0.0,
         {"gpinfer Adam.step_into": lambda: adam.step_into(theta, grad)}),
        ("Z - shift [C,M,D] (the forward reads Z, writes the shifted inputs)", 1, 0.0,
         {"subtract": lambda: np.subtract(Z, shift, out=W)}),
        ("g_Z scaled into the gradient [C,M,D] (the VJP's last pass)", 1, 0.0,
         {"multiply": lambda: np.multiply(W, scale, out=Z2)}),
    ]


def call_floor(rate: float, repeats: int = 7) -> dict[str, object]:
    """The step's *call floor*: each dense call of ``_call_list`` timed on its own (least
    process-CPU time of ``repeats``, interleaved), times its count per step, summed; with its
    FLOP rate and its time at the dgemm rate, so the floor's excess over the dgemm floor is
    the per-call cost of small batched ``trsm``/``potrf``/``trtri`` and the step's excess
    over the call floor is the code's overhead."""
    calls = _call_list()
    best = [np.inf] * len(calls)
    for _ in range(repeats):
        for i, (_, _, _, thunk) in enumerate(calls):
            t0 = time.process_time()
            thunk()
            best[i] = min(best[i], time.process_time() - t0)
    alternatives = _inverse_or_solve(repeats)
    rows, total, flops = {}, 0.0, 0.0
    for (name, count, fl, _), t in zip(calls, best):
        rows[name] = {"per_step": count, "ms_per_step": round(1e3 * count * t, 2),
                      "gflops": round(fl / t / 1e9, 1),
                      "ms_at_dgemm_rate": round(1e3 * count * fl / rate, 2)}
        total += count * t
        flops += count * fl
    return {"call_floor_ms": 1e3 * total, "calls_gflop": flops / 1e9,
            "calls_at_dgemm_rate_ms": 1e3 * flops / rate, "calls": rows,
            "cavity_factor_two_solves_ms": alternatives}


def necessary_floor(rate: float, repeats: int = 7) -> dict[str, object]:
    """The *floor of the necessary calls*: each dense call the step's maths needs
    (``_necessary_calls``) timed in every way this machine offers (least process-CPU time of
    ``repeats``, interleaved), the fastest way kept, times its count per step, summed; against
    the dgemm floor of the issue's FLOP model (``step_flops() / rate``). What the step costs
    above this sum is element-wise work, allocation and Python; what this sum costs above the
    dgemm floor is the rate LAPACK/BLAS reach on ``[C, 200, 200]`` stacks on one thread, and
    the memory-bound moves of the ``P ~ C M D`` parameters the FLOP model leaves out (Adam's
    update, the forward's read of ``Z``, the gradient's write)."""
    calls = _necessary_calls()
    best: list[dict[str, float]] = [{way: np.inf for way in ways} for _, _, _, ways in calls]
    for _ in range(repeats):
        for i, (_, _, _, ways) in enumerate(calls):
            for way, thunk in ways.items():
                t0 = time.process_time()
                thunk()
                best[i][way] = min(best[i][way], time.process_time() - t0)
    rows, total, flops = {}, 0.0, 0.0
    for (name, count, fl, _), times in zip(calls, best):
        way = min(times, key=times.__getitem__)
        t = times[way]
        rows[name] = {"per_step": count, "best_way": way, "ms_per_step": round(1e3 * count * t, 2),
                      "gflops": round(fl / t / 1e9, 1) if fl else None,
                      "ms_at_dgemm_rate": round(1e3 * count * fl / rate, 2),
                      "ways_ms_per_call": {k: round(1e3 * v, 2) for k, v in times.items()}}
        total += count * t
        flops += count * fl
    floor = step_flops() / rate
    return {"necessary_calls_ms": 1e3 * total, "necessary_calls_gflop": flops / 1e9,
            "dgemm_floor_ms": 1e3 * floor, "ratio_to_dgemm_floor": total / floor,
            "calls": rows}


def _inverse_or_solve(repeats: int, M_: int = M, B_: int = B, C_: int = C) -> dict[str, float]:
    """The evaluation's ``B_cav^-1 A`` ``[C, M, B]`` from the cavity factor ``L_B``: CPU ms of
    two ``trsm`` (``R = L_B^-1 A``, then ``L_B^-T R``), of one ``trtri`` and two ``trmm``, and
    of ``potri`` and one ``gemm`` (numpy's choice: ``gpinfer.sites.stacked.paired_by_inverse``)
    (least of ``repeats``, interleaved; ``_stand_ins``' ``L`` and ``Kuf``)."""
    from gpinfer.backend import ops

    a = _stand_ins(M_, B_, C_=C_)
    LB, A = a["L"], a["Kuf"]

    def solves() -> None:
        ops.solve_triangular(LB, ops.solve_triangular(LB, A), transpose=True)

    def inverse() -> None:
        T = ops.tri_inverse(LB)
        ops.tri_matmul(T, ops.tri_matmul(T, A), transpose=True)

    def potri() -> None:
        ops.cho_inverse(LB)[0] @ A

    ways = (("two trsm", solves), ("trtri + two trmm", inverse), ("potri + gemm", potri))
    best = {name: np.inf for name, _ in ways}
    for _ in range(repeats):
        for name, f in ways:
            t0 = time.process_time()
            f()
            best[name] = min(best[name], time.process_time() - t0)
    return {k: round(1e3 * v, 2) for k, v in best.items()}


TORCH_CPU64 = {"backend": "torch", "device": "cpu", "dtype": "float64"}


def sep_ops_per_step(steps: int = 3, n: int = 1000, options: dict | None = None
                     ) -> dict[str, float]:
    """Aten operators per SEP step at MNIST size on torch-CPU float64 (steps of epoch 2;
    ``gpinfer.testing.step_profile``: a step with its optimiser update; ``options``: sep's,
    e.g. ``compile``)."""
    from gpinfer.kernels import make_kernel
    from gpinfer.testing.step_profile import profile_steps
    from gpinfer.training.minibatch import MiniBatchSchedule

    X, y = mnist_like(n=n)

    def fit() -> None:
        fit_steps(X, y, "sep", M, B, 2, options or {"adam_learning_rate": 1e-3},
                  kernel=make_kernel("rbf", D, ard=True), settings=TORCH_CPU64)

    return profile_steps(fit, MiniBatchSchedule, "_group", first=-(-n // B) + 1, steps=steps)


def torch_compiled(epochs: int, n: int = 1000) -> dict[str, object]:
    """The torch-CPU float64 SEP step at MNIST size eagerly and with ``compile="default"``,
    one after the other in one process: CPU ms per step (epochs 2..; epoch 1 compiles) and
    aten operators per step (the compiled functions are reused by the second fit)."""
    from gpinfer.kernels import make_kernel

    X, y = mnist_like(n=n)
    out: dict[str, object] = {}
    for mode in ("none", "default"):
        options = {"adam_learning_rate": 1e-3, "compile": mode}
        timed = fit_steps(X, y, "sep", M, B, epochs, options,
                          kernel=make_kernel("rbf", D, ard=True), settings=TORCH_CPU64)
        out[f"compile={mode}"] = {"step_cpu_ms": 1e3 * float(timed["step_cpu_s"]),
                                  **sep_ops_per_step(n=n, options=options)}
    return out


def _digits_train() -> tuple[np.ndarray, np.ndarray]:
    """digits split 0's training points ``X [1617, 64]`` (scaled to ``[0, 1]``) and labels."""
    from sklearn.datasets import load_digits

    from gpinfer.data import load_dataset

    try:
        ds = load_dataset("digits")
        X, y = ds.X, ds.y
    except Exception:  # noqa: BLE001 - scikit-learn's copy is the same data
        X, y = load_digits(return_X_y=True)
    X = X / 16.0
    rng = np.random.default_rng(0)
    train = np.sort(rng.permutation(X.shape[0])[: int(0.9 * X.shape[0])])
    return X[train], y[train]


def digits_shared_phases(epochs: int) -> dict[str, object]:
    """Where digits' shared sep step goes (M = 100, batches of 200, ``shared_inducing``; the
    model GPflow's SVGP is timed against): process-CPU ms per step of its phases and of the
    shared path's main calls, over epochs 2..E (``PhaseClock``: one clock read per call, where
    ``cProfile`` inflates the many small calls, e.g. ``argmax_factor_tilted`` about 4x)."""
    import gpinfer_ep.state as state
    from gpinfer_ep.method import SparseSites

    from gpinfer.hyper import HyperParameters
    from gpinfer.training.loop import TrainingLoop

    X, y = _digits_train()
    phases = {"kernel terms (Kuu, Kuf, chol, A)": (SparseSites, "prepare"),
              "site update": (SparseSites, "update"),
              "  its cavity moments (chol, trsm)": (state, "cavity_moments"),
              "  its tilted slopes (argmax factors)": (state, "pair_slopes"),
              "  its site products A diag(tau_c) A^T": (state, "shared_site_products"),
              "  its kept sums (Frame, or rebased by T = L^-1 L')": (state.TiedSites,
                                                                    "_kept_sums"),
              "log Z_q + matrix gradients": (SparseSites, "objective"),
              "  q and cavity (2 chol, 2 potri, B^-1 A)": (state, "shared_paired"),
              "  tilted log Z (argmax factors)": (state, "pair_log_z"),
              "  summed matrix gradients": (state, "shared_matrix_gradients"),
              "kernel VJPs (hp.gradient)": (HyperParameters, "gradient"),
              "optimiser (Adam, pack/unpack)": (TrainingLoop, "_ascend"),
              "one step, all of it": (TrainingLoop, "_step")}
    with PhaseClock(phases) as clock:
        out = fit_steps(X, y, "sep", 100, 200, epochs,
                        {"adam_learning_rate": 0.01, "shared_inducing": True},
                        after_warm_up=clock.spent.clear)
    n_steps = (epochs - 1) * -(-X.shape[0] // 200)  # epochs 2..: the clock restarted
    return {"step_cpu_ms (epochs 2..)": round(1e3 * float(out["step_cpu_s"]), 2),
            "phases_ms_per_step (epochs 2..)": {k: round(1e3 * clock.spent[k] / n_steps, 3)
                                                for k in phases if k in clock.spent}}


def digits(epochs: int) -> dict[str, float]:
    Xtr, ytr = _digits_train()
    out = {}
    out["sep_step_cpu_ms"] = 1e3 * fit_steps(
        Xtr, ytr, "sep", 100, 200, epochs, {"adam_learning_rate": 0.01})["step_cpu_s"]
    out["sep_shared_step_cpu_ms"] = 1e3 * fit_steps(  # one Z and one kernel for every class
        Xtr, ytr, "sep", 100, 200, epochs,
        {"adam_learning_rate": 0.01, "shared_inducing": True})["step_cpu_s"]
    out["svi_step_cpu_ms"] = 1e3 * fit_steps(
        Xtr, ytr, "svi", 100, 200, epochs,
        {"optimizer": "adam", "optimizer_options": {"learning_rate": 0.01}},
        likelihood="robustmax")["step_cpu_s"]
    out["svi_shared_step_cpu_ms"] = 1e3 * fit_steps(  # GPflow SVGP's model: one Z, one kernel
        Xtr, ytr, "svi", 100, 200, epochs,
        {"optimizer": "adam", "optimizer_options": {"learning_rate": 0.01},
         "shared_inducing": True}, likelihood="robustmax")["step_cpu_s"]
    return out


def _always(value: bool) -> Callable[[int, int], bool]:
    """A stand-in for ``transposed_cross`` that answers ``value`` at every shape."""
    return lambda B_, D_: value


def cross_layouts(Ms: tuple[int, ...] = (50, 100, 200, 400),
                  Bs: tuple[int, ...] = (50, 100, 200, 256, 400, 1000),
                  Ds: tuple[int, ...] = (32, 64, 128, 256, 512, 784)) -> dict[str, object]:
    """Item 10: numpy's cross product ``-2 As Xs^T`` ``[C, M, B]`` of the stacked kernel path
    (``gpinfer.kernels.stacked._host_cross``) in both layouts, forced, at each ``(M, B, D)``
    (``C = 10``): median process-CPU ms of rounds alternating the two (32 MB written between
    calls, as the step's other arrays evict these), the ratio transposed / rows and whether
    ``transposed_cross`` picks the transposed form there."""
    from gpinfer.kernels import stacked

    rng = np.random.default_rng(0)
    evict = np.empty(4_000_000)
    rule = stacked.transposed_cross
    rows: dict[str, object] = {}
    try:
        for M_ in Ms:
            for B_ in Bs:
                for D_ in Ds:
                    As, Xs = rng.normal(size=(C, M_, D_)), rng.normal(size=(B_, D_))
                    reps = max(3, min(15, int(3e9 / (C * M_ * B_ * D_))))
                    times: dict[bool, list[float]] = {False: [], True: []}
                    for r in range(reps):
                        for transposed in ((False, True) if r % 2 == 0 else (True, False)):
                            forced = _always(transposed)
                            stacked.transposed_cross = forced  # type: ignore[assignment]
                            evict.fill(1.0)
                            t0 = time.process_time()
                            stacked._host_cross(As, Xs)
                            times[transposed].append(time.process_time() - t0)
                    rows_ms, t_ms = (1e3 * float(np.median(times[k])) for k in (False, True))
                    rows[f"M {M_} B {B_} D {D_}"] = {
                        "rows_ms": round(rows_ms, 3), "transposed_ms": round(t_ms, 3),
                        "ratio": round(t_ms / rows_ms, 2), "rule_transposed": rule(B_, D_)}
    finally:
        stacked.transposed_cross = rule
    return rows


def main() -> None:
    from flop_models import dgemm_rate

    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--digits-epochs", type=int, default=8)
    ap.add_argument("--parts", default="sep,ops,digits",
                    help="comma-separated: sep (MNIST-size CPU step), floor (its dense calls timed "
                    "one by one), necessary (the calls its maths needs, each in its fastest "
                    "way), ops (aten ops), digits, digits-phases (the shared sep step's "
                    "phases), "
                    "compiled (torch-CPU step eager vs compile='default'), cross (the "
                    "kernel path's cross product in both layouts over a grid of shapes)")
    ap.add_argument("--peers", default=None, help="side venv of ../shared/peers (GPflow ratio)")
    a = ap.parse_args()
    with threadpool_limits(limits=1):
        rate = dgemm_rate(repeats=10, clock=time.process_time)
        parts = a.parts.split(",")
        report: dict[str, object] = {"dgemm_gflops_one_thread": rate / 1e9,
                                     "load_average": os.getloadavg()}
        if "floor" in parts:
            report["sep_mnist_size_call_floor"] = call_floor(rate)
        if "necessary" in parts:
            report["sep_mnist_size_necessary_floor"] = necessary_floor(rate)
        if "sep" in parts:
            report["sep_mnist_size"] = sep_mnist_size(a.epochs, rate)
        if "ops" in parts:
            report["sep_mnist_size_torch_cpu_ops_per_step"] = sep_ops_per_step()
        if "compiled" in parts:
            report["sep_mnist_size_torch_cpu_compiled"] = torch_compiled(a.epochs)
        if "digits" in parts:
            report["digits"] = digits(a.digits_epochs)
        if "digits-phases" in parts:
            report["digits_shared_sep_phases"] = digits_shared_phases(a.digits_epochs)
        if "cross" in parts:
            report["cross_product_layouts"] = cross_layouts()
    print(json.dumps(report, indent=1))
    if a.peers:
        peers = ROOT.parent / "shared" / "peers"
        out = ROOT / "outputs" / "peers_mb.jsonl"
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        subprocess.run([sys.executable, str(peers / "minibatch.py"), str(ROOT), a.peers,
                        "--out", str(out), "--rounds", "1"], check=True, env=env)
        subprocess.run([sys.executable, str(peers / "minibatch.py"), "--summary", str(out)],
                       check=True)


if __name__ == "__main__":
    main()
