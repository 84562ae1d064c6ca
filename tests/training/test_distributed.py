"""The process-group helpers (``gpinfer.training.distributed``): no group, rows, sums."""

import numpy as np
import pytest

from gpinfer.training import distributed


def test_no_group_is_one_process():
    assert distributed.current() is None
    assert distributed.is_main()


@pytest.mark.parametrize("B, K", [(10, 2), (7, 3), (2, 3)])
def test_rows_partition_the_batch(B, K):
    batch = np.random.default_rng(0).permutation(50)[:B]
    parts = [distributed.Group(r, K).rows(batch) for r in range(K)]
    np.testing.assert_array_equal(np.concatenate(parts), batch)
    assert max(p.size for p in parts) - min(p.size for p in parts) <= 1


def test_all_reduce_sum_over_two_gloo_ranks(tmp_path):
    pytest.importorskip("torch")
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks("""
        import torch
        from gpinfer.training.distributed import current
        g = current()
        a = np.arange(5.0) * (g.rank + 1)
        t = torch.arange(3, dtype=torch.float64) + 10 * g.rank
        s = g.all_reduce_sum(a)
        save(rank=g.rank, size=g.size, a=a, s=s, t=g.all_reduce_sum(t).numpy())
    """, 2, tmp_path)
    for r, o in enumerate(out):
        assert int(o["rank"]) == r and int(o["size"]) == 2
        np.testing.assert_array_equal(o["a"], np.arange(5.0) * (r + 1))  # input untouched
        np.testing.assert_array_equal(o["s"], np.arange(5.0) * 3)
        np.testing.assert_array_equal(o["t"], 2 * np.arange(3.0) + 10)
