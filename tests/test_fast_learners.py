"""The fast paths of the learners against the straightforward computations."""

import importlib
from decimal import Decimal, localcontext

import mpmath
import numpy as np
import pytest
import torch
from helpers import linear_data

from iclprobe import algorithms, tasks
from iclprobe.algorithms import prefix, sequential
from iclprobe.algorithms.learners import power_decays
from iclprobe.algorithms.prefix import exclusive_cumsum
from iclprobe.algorithms.reference import gd_direct, newton_direct, online_gd_direct


def exact_gd(stats, lr, k):
    """GD's closed form ``Σ (β/λ)(1 − (1 − lr λ/t)^k) q`` in 60-digit decimals."""
    b, n, d = stats.eigvals.shape
    out = torch.zeros(b, n, dtype=torch.float64)
    with localcontext() as ctx:
        ctx.prec = 60
        for s in range(b):
            for t in range(1, n):
                total = Decimal(0)
                for i in range(d):
                    lam = Decimal(stats.eigvals[s, t, i].item())
                    if lam > 0:
                        decay = (1 - Decimal(lr) / t * lam) ** k
                        total += (Decimal(stats.xty_eig[s, t, i].item()) / lam * (1 - decay)
                                  * Decimal(stats.query_eig[s, t, i].item()))
                out[s, t] = float(total)
    return out


@pytest.mark.parametrize("lr", [2e-4, 1e-3])
def test_gd_powers_are_exact_to_rounding_at_many_steps(lr):
    # (1 − x)**k with 1 − x rounded is off by up to k·ε/2 (~1e-13 at k = 4096);
    # exp(k log1p(−x)) rounds nothing k-fold.
    xs, ys = linear_data(b=2, n=8)
    ref = exact_gd(algorithms.prefix_stats(xs, ys), lr, 4096)
    got = algorithms.gd(xs, ys, steps=[4096], lr=lr).preds[0]
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 2e-15


def test_power_decays_equal_pow_also_past_the_boundaries():
    x = torch.tensor([0.0, 1e-9, 0.3, 1.0, 1.5, 2.0, 2.5], dtype=torch.float64)
    exponents = [0.0, 1.0, 2.0, 3.0, 7.0, 40.0]
    stacks = list(power_decays(x, exponents))
    assert all(s.shape[-1] == x.shape[-1] for s in stacks)
    for e, got in zip(exponents, torch.cat(stacks).unbind(-2)):
        want = (1.0 - x) ** e
        # where the power underflows (x = 1, e >= 1) the decay stops at e^-700
        want = torch.where(want.abs() < 1e-304, torch.full_like(want, np.exp(-700.0)), want)
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0.0)
    scalar = next(power_decays(torch.tensor(0.5, dtype=torch.float64), [0.0, 2.0]))
    assert scalar.shape == (2, 1) and scalar[:, 0].tolist() == [1.0, 0.25]  # 0-d x: [1]
    far = next(power_decays(x[:3], [2.0**60]))[0]  # Newton's 2^k with k = 60
    assert bool((far[1:] < 1e-300).all()) and far[0] == 1.0


def test_newton_closed_form_is_the_matrix_iteration():
    xs, ys = linear_data(n=10, d=4, noise=0.1)
    steps = [0, 1, 2, 5, 9, 16, 24]
    for alpha in ("frobenius", "spectral"):
        it = algorithms.newton(xs, ys, steps, alpha=alpha)
        ref = newton_direct(xs, ys, steps, alpha=alpha)
        torch.testing.assert_close(it.preds, ref, rtol=1e-10, atol=1e-10)
    far = algorithms.newton(xs, ys, [200])  # 2^200 steps: converged, exactly OLS's coefficients
    torch.testing.assert_close(far.weights[0], algorithms.ols(xs, ys).weights[0],
                               rtol=1e-13, atol=1e-13)


def test_gd_log_grid_is_the_direct_iteration():
    xs, ys = linear_data(n=8, d=3)
    steps = [2**i for i in range(8)]
    it = algorithms.gd(xs, ys, steps, lr=0.05, normalize=False)
    torch.testing.assert_close(it.preds, gd_direct(xs, ys, steps, 0.05, normalize=False),
                               rtol=1e-11, atol=1e-11)


def test_shared_stats_are_left_untouched_and_give_the_same_results():
    xs, ys = linear_data(b=4, n=9, d=3, noise=0.2)
    stats = algorithms.prefix_stats(xs, ys)
    before = {k: v.clone() for k, v in stats._asdict().items() if torch.is_tensor(v)}
    runs = {"gd": ([1, 8, 64], {"lr": "max"}), "newton": ([0, 3, 12], {}),
            "cg": ([0, 1, 2, 4], {}), "momentum": ([2, 9], {"lr": 0.05}), "ols": (None, {})}
    for name, (steps, hyper) in runs.items():
        shared = algorithms.iterates(name, xs, ys, steps, stats=stats, **hyper)
        again = algorithms.iterates(name, xs, ys, steps, stats=stats, **hyper)
        alone = algorithms.iterates(name, xs, ys, steps, **hyper)
        for other in (again, alone):
            assert torch.equal(shared.preds, other.preds), name
            assert torch.equal(shared.weights, other.weights), name
    for key, value in before.items():
        assert torch.equal(getattr(stats, key), value), key


def test_kept_step_size_free_terms_follow_the_statistics_they_were_made_from(monkeypatch):
    """The closed-form learners keep the terms of the last statistics that do not depend on
    the step size (`prefix.spectral_terms`): runs that alternate between two batches' statistics
    give the numbers of runs with nothing kept, and nothing kept for one batch reaches
    another's run."""
    data = [linear_data(b=3, n=8, d=3, noise=0.1, seed=s) for s in (0, 1)]
    stats = [algorithms.prefix_stats(xs, ys) for xs, ys in data]
    runs = [("gd", [1, 7], {"lr": "max", "lr_scale": 0.7}), ("newton", [2, 5], {}),
            ("momentum", [3, 6], {"lr": "max", "beta": 0.5})]

    def alternating():
        return [algorithms.iterates(name, *data[i], steps, stats=stats[i], **hyper)
                for _ in range(2) for i in (0, 1, 0) for name, steps, hyper in runs]

    kept = alternating()
    assert prefix._TERMS  # something was kept to be reused
    monkeypatch.setattr(prefix, "_TERMS", _Forgetful())
    for a, b in zip(kept, alternating()):
        assert torch.equal(a.preds, b.preds) and torch.equal(a.weights, b.weights)


def test_blocks_of_one_batch_keep_their_terms_for_every_run(monkeypatch):
    """Split into blocks, runs at several step sizes on one batch's statistics compute each
    block's step-size-free terms once (`prefix._blocks` hands every run the same block
    objects): the numbers are those of runs with nothing kept and of one run on the whole
    batch, bit for bit, and another batch's statistics get blocks and terms of their own."""
    data = [linear_data(b=5, n=8, d=3, noise=0.1, seed=s) for s in (0, 1)]
    stats = [algorithms.prefix_stats(xs, ys) for xs, ys in data]
    runs = [("gd", [1, 7], {"lr": "max", "lr_scale": 0.7}), ("newton", [2, 5], {}),
            ("gd", [3], {"lr": "max", "lr_scale": 0.3}),
            ("momentum", [3, 6], {"lr": "max", "beta": 0.5})]

    def run(i):
        return [algorithms.iterates(name, *data[i], steps, stats=stats[i], **hyper)
                for name, steps, hyper in runs]

    whole = run(0)  # 5 sequences in one block
    monkeypatch.setattr(prefix, "BLOCK_BYTES", 2 * 8 * 3 * 8)  # 2 sequences a block: 3
    monkeypatch.setattr(prefix, "_TERMS", [])
    monkeypatch.setattr(prefix, "_BLOCKS", [])
    name, steps, hyper = runs[0]
    algorithms.iterates(name, *data[0], steps, stats=stats[0], **hyper)
    first = [t for _, _, t in prefix._TERMS]
    kept = run(0)
    assert len(first) == 3  # one per block, found again by every later run
    assert [t for _, _, t in prefix._TERMS] == first
    assert all(a is b for a, (_, _, b) in zip(first, prefix._TERMS))
    other = run(1)
    assert len(prefix._TERMS) == 3 and prefix._BLOCKS[0][0] is stats[1]  # none of stats[0]'s
    assert all(a.eigvals is b.eigvals for (a, _, _), b in zip(prefix._TERMS, prefix._BLOCKS[0][3]))
    monkeypatch.setattr(prefix, "_TERMS", _Forgetful())
    monkeypatch.setattr(prefix, "_BLOCKS", _Forgetful())
    for a, b, c in zip(kept + other, run(0) + run(1), whole + [None] * len(runs)):
        assert torch.equal(a.preds, b.preds) and torch.equal(a.weights, b.weights)
        assert c is None or (torch.equal(a.preds, c.preds) and torch.equal(a.weights, c.weights))



def test_statistics_changed_in_place_get_their_terms_computed_anew():
    """The kept terms follow the statistics' tensors by identity: statistics edited in place
    into those of other data (y doubled: ``given_stats`` accepts them for those data) got
    the old data's terms, and GD's predictions were off by 1.35. The tensors' version
    counters now tell the edit, also seen through a block's views."""
    xs, ys = linear_data(b=8, n=10, d=4, noise=0.1, seed=0)
    for block_bytes in (prefix.BLOCK_BYTES, 3 * 10 * 4 * 8):  # whole, then in blocks of 3
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(prefix, "BLOCK_BYTES", block_bytes)
            stats = algorithms.prefix_stats(xs, ys)
            before = algorithms.gd(xs, ys, steps=[3], lr=0.1, stats=stats).preds
            for t in (stats.xty, stats.xty_eig):
                t.mul_(2)  # now the statistics of (xs, 2 ys)
            after = algorithms.gd(xs, 2 * ys, steps=[3], lr=0.1, stats=stats).preds
            fresh = algorithms.gd(xs, 2 * ys, steps=[3], lr=0.1).preds
        torch.testing.assert_close(after, fresh, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(after, 2 * before, rtol=1e-12, atol=1e-12)


class _Forgetful(list):
    """A cache that keeps nothing: every run computes its terms afresh."""

    def __setitem__(self, index, value):
        pass


def test_a_kept_preconditioner_root_is_used_for_that_preconditioner_only():
    """pGD keeps the last preconditioner's square root, found by value: another matrix is
    decomposed (and checked) afresh, the same one given again gives the same numbers."""
    pgd_module = importlib.import_module("iclprobe.algorithms.pgd")  # (the package's
    # name pgd is the learner)
    xs, ys = linear_data(n=8, d=3)
    m1 = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]], dtype=torch.float64)
    m2 = torch.diag(torch.tensor([0.5, 1.5, 3.0], dtype=torch.float64))
    first = algorithms.pgd(xs, ys, steps=[3], precond=m1, lr=0.1)
    other = algorithms.pgd(xs, ys, steps=[3], precond=m2, lr=0.1)
    again = algorithms.pgd(xs, ys, steps=[3], precond=m1.clone(), lr=0.1)
    assert torch.equal(first.preds, again.preds) and not torch.equal(first.preds, other.preds)
    torch.testing.assert_close(other.weights[0], pgd_loop(xs, ys, m2, 0.1, 3), rtol=1e-12,
                               atol=1e-12)
    root = pgd_module._ROOTS[0][1]
    torch.testing.assert_close(root @ root, m1)
    bad = m1.clone()
    bad[0, 0] = -1.0  # not positive definite: refused although m1 is kept
    with pytest.raises(ValueError, match="positive definite"):
        algorithms.pgd(xs, ys, steps=[3], precond=bad, lr=0.1)
    # the caches compare device and dtype first: torch.equal raises across devices (a CPU
    # call's cache met by a CUDA call; the meta device stands in for it here) and holds
    # float32's 1.0 equal to float64's
    same = pgd_module._same
    assert same(m1, m1.clone()) and not same(m1, m1.float()) and not same(m1, m1[:2])
    assert not same(m1, torch.empty(3, 3, dtype=torch.float64, device="meta"))
    with pytest.raises(RuntimeError):
        torch.equal(m1, torch.empty(3, 3, dtype=torch.float64, device="meta"))


def test_prefix_stats_sums_as_the_plain_cumulative_sum():
    xs, ys = linear_data(b=2, n=7, d=4)
    stats = algorithms.prefix_stats(xs, ys)
    assert torch.equal(stats.gram, exclusive_cumsum(xs[..., :, None] * xs[..., None, :]))
    assert torch.equal(stats.xty, exclusive_cumsum(xs * ys[..., None]))
    v = stats.eigvecs
    torch.testing.assert_close(stats.query_eig, torch.einsum("bpji,bpj->bpi", v, xs),
                               rtol=1e-15, atol=1e-15)


def pgd_loop(xs, ys, m, lr, steps):
    """Preconditioned GD per prefix, ``w <- w − lr M (1/t) Xᵀ(Xw − y)``, in numpy."""
    x, y, m = xs.numpy(), ys.numpy(), m.numpy()
    out = np.zeros(x.shape)
    for s in range(x.shape[0]):
        for t in range(1, x.shape[1]):
            w = np.zeros(x.shape[2])
            for _ in range(steps):
                w = w - lr * m @ (x[s, :t].T @ (x[s, :t] @ w - y[s, :t]) / t)
            out[s, t] = w
    return torch.from_numpy(out)


@pytest.mark.parametrize("precond_scale", [1.0, 0.5])  # 2.5 x lr 0.1 diverges (refused)
@pytest.mark.parametrize("lr", [0.1, "max"])
def test_pgd_on_a_multiple_of_the_identity_is_gd_on_shared_stats(precond_scale, lr):
    xs, ys = linear_data(n=8, d=3)
    m = precond_scale * torch.eye(3, dtype=torch.float64)
    stats = algorithms.prefix_stats(xs, ys)
    it = algorithms.pgd(xs, ys, steps=[1, 5, 40], precond=m, lr=lr, stats=stats)
    gd_lr = lr if lr == "max" else lr * precond_scale
    want = algorithms.gd(xs, ys, steps=[1, 5, 40], lr=gd_lr, stats=stats)
    assert torch.equal(it.preds, want.preds) and torch.equal(it.weights, want.weights)
    precond = it.hyper.pop("precond")  # the preconditioner as given, a copy
    assert it.hyper == {"lr": lr, "normalize": True}
    assert torch.equal(precond, m) and precond.data_ptr() != m.data_ptr()
    per_seq = algorithms.pgd(xs, ys, steps=[1, 5, 40], precond=m.expand(3, 3, 3), lr=lr)
    assert torch.equal(per_seq.preds, it.preds)
    if lr != "max":
        torch.testing.assert_close(it.weights[1], pgd_loop(xs, ys, m, lr, 5), rtol=1e-12,
                                   atol=1e-12)


def test_pgd_ignores_stats_for_a_general_preconditioner():
    xs, ys = linear_data(n=8, d=3)
    m = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]], dtype=torch.float64)
    stats = algorithms.prefix_stats(xs, ys)
    with_stats = algorithms.pgd(xs, ys, steps=[3], precond=m, lr=0.1, stats=stats)
    without = algorithms.pgd(xs, ys, steps=[3], precond=m, lr=0.1)
    assert torch.equal(with_stats.preds, without.preds)
    torch.testing.assert_close(with_stats.weights[0], pgd_loop(xs, ys, m, 0.1, 3), rtol=1e-12,
                               atol=1e-12)  # and both are right, not just equal


def test_pgd_shortcut_names_its_own_stable_lr():
    xs, ys = linear_data(n=8, d=3)
    m = 4.0 * torch.eye(3, dtype=torch.float64)
    x = xs.numpy()
    top = max(np.linalg.eigvalsh(4.0 * x[s, :t].T @ x[s, :t]).max() / t
              for s in range(3) for t in range(1, 8))  # of M S_t / t: pgd's Hessian
    with pytest.raises(ValueError, match=rf"pgd: lr=\S+ diverges on these data .* the largest "
                                         rf"stable lr here is 2/max\(c·λ_max\) = {2 / top:.3g}$"):
        algorithms.pgd(xs, ys, steps=[2000], precond=m, lr=10 / top)


@pytest.mark.parametrize("lr", ["normalized", 0.05])
@pytest.mark.parametrize(("n", "d"), [(9, 3), (5, 8)])
def test_online_gd_pass_maps_are_the_example_by_example_loop(lr, n, d, monkeypatch):
    xs, ys = linear_data(b=5, n=n, d=d, noise=0.3)
    init = torch.rand(5, n, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    passes = [1, 2, 5]
    ref = online_gd_direct(xs, ys, passes, lr=lr, init=init)
    it = algorithms.online_gd(xs, ys, steps=passes, lr=lr, init=init)
    torch.testing.assert_close(it.weights, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(it.preds, (ref * xs).sum(-1), rtol=1e-12, atol=1e-12)
    # blocks of 2 sequences (the last one ragged) give the same numbers as one block
    monkeypatch.setattr(sequential, "BLOCK_BYTES", 2 * n * d * d * 8)
    blocked = algorithms.online_gd(xs, ys, steps=passes, lr=lr, init=init)
    assert torch.equal(blocked.weights, it.weights)


def test_blocks_of_sequences_give_the_numbers_of_one_block(monkeypatch):
    xs, ys = linear_data(b=7, n=9, d=3, noise=0.2)
    stats = algorithms.prefix_stats(xs, ys)
    runs = {"gd": ([1, 8, 64], {"lr": "max"}), "newton": ([0, 3, 12], {"alpha": "spectral"}),
            "cg": ([0, 1, 2, 4], {}), "momentum": ([2, 9], {"lr": "max"})}
    whole = {name: algorithms.iterates(name, xs, ys, steps, stats=stats, **hyper)
             for name, (steps, hyper) in runs.items()}
    monkeypatch.setattr(prefix, "BLOCK_BYTES", 3 * 9 * 3 * 8)  # blocks of 3, 3 and 1
    for name, (steps, hyper) in runs.items():
        blocked = algorithms.iterates(name, xs, ys, steps, stats=stats, **hyper)
        assert torch.equal(blocked.preds, whole[name].preds), name
        assert torch.equal(blocked.weights, whole[name].weights), name


@pytest.mark.parametrize("per_stack", [1, 3])
def test_stacked_decays_give_the_numbers_of_one_stack(monkeypatch, per_stack):
    # GD and Newton run their step counts' decays in stacks (`STACK_BYTES`): on these small
    # data every step count fits one stack; stacks of 3 and of 1 (the computation one step
    # count at a time) must give the same numbers. Equal here bit for bit; checked to
    # rounding, as a batched product may sum in another order on another BLAS.
    from iclprobe.algorithms import learners, spectral
    xs, ys = linear_data(b=5, n=12, d=4, noise=0.2)
    stats = algorithms.prefix_stats(xs, ys)
    runs = {"gd": (list(range(20)) + [40, 400], {"lr": "max"}),
            "newton": (list(range(12)), {"alpha": "spectral"}),
            "pgd": ([0, 1, 3, 9, 27], {"lr": 0.05, "precond": torch.diag(torch.arange(1.0, 5.0))})}
    whole = {name: algorithms.iterates(name, xs, ys, steps, stats=stats, **hyper)
             for name, (steps, hyper) in runs.items()}
    sizes = []
    real = learners.power_decays

    def counted(x, exponents):
        for part in real(x, exponents):
            sizes.append(part.shape[-2])
            yield part
    monkeypatch.setattr(learners, "power_decays", counted)
    monkeypatch.setattr(spectral, "STACK_BYTES", per_stack * 5 * 12 * 4 * 8)  # decays of 1920 B
    for name, (steps, hyper) in runs.items():
        cut = algorithms.iterates(name, xs, ys, steps, stats=stats, **hyper)
        for got, want in ((cut.preds, whole[name].preds), (cut.weights, whole[name].weights)):
            scale = float(want.abs().max())
            torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14 * scale)
    assert max(sizes) == per_stack and sizes.count(per_stack) > 3  # several stacks each


@pytest.mark.parametrize("shape", [(4,), (12, 4), (1, 12, 4), (5, 1, 4)])
def test_decays_of_a_broadcast_rate_are_those_of_the_whole_block(shape):
    # power_decays of an x that broadcasts to the block [5, 12, 4] (a rate shared by
    # sequences, or by positions) are that block's decays, for any number of step counts
    from iclprobe.algorithms.spectral import power_decays, spectral_iterates
    xs, ys = linear_data(b=5, n=12, d=4, noise=0.2)
    stats = algorithms.prefix_stats(xs, ys)
    x = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for exponents in ([3.0], [0.0, 1.0, 2.0, 5.0, 9.0], [float(k) for k in range(12)]):
        small = spectral_iterates(stats, lambda b, e=exponents: power_decays(x, e), True)
        full = spectral_iterates(
            stats, lambda b, e=exponents: power_decays(x.expand(b.eigvals.shape), e), True)
        assert small[0].shape == (len(exponents), 5, 12)
        assert torch.equal(small[0], full[0]) and torch.equal(small[1], full[1])


@pytest.mark.parametrize("name", ["gd", "newton", "cg", "online_gd", "ols", "pgd"])
def test_no_positions_is_refused_and_no_dimensions_predicts_zero(name):
    hyper = {"steps": [1, 2]} if name != "ols" else {}
    xs, ys = torch.zeros(2, 0, 3, dtype=torch.float64), torch.zeros(2, 0, dtype=torch.float64)
    extra = {"precond": torch.eye(3)} if name == "pgd" else {}
    with pytest.raises(ValueError, match=r"xs must hold at least one position, got shape "
                                         r"\(2, 0, 3\)"):
        algorithms.iterates(name, xs, ys, **hyper, **extra)
    xs, ys = torch.zeros(2, 5, 0, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    extra = {"precond": torch.eye(0)} if name == "pgd" else {}
    it = algorithms.iterates(name, xs, ys, **hyper, **extra)
    assert it.weights.shape[-1] == 0 and torch.equal(it.preds, torch.zeros_like(it.preds))


def exact_cg(lam, b, q, steps, digits=50):
    """CG in the eigenbasis of one prefix in ``digits``-digit arithmetic (mpmath): the
    predictions ``uᵀ q`` after each of ``steps`` steps, as floats."""
    with mpmath.workdps(digits):
        lam, b, q = ([mpmath.mpf(v) for v in x.tolist()] for x in (lam, b, q))
        u, r, p = [mpmath.mpf(0)] * len(b), b[:], b[:]
        rr, out = sum(x * x for x in r), []
        for _ in range(steps + 1):
            out.append(float(sum(x * y for x, y in zip(u, q))))
            curv = sum(x * y * y for x, y in zip(lam, p))
            if rr < mpmath.mpf(10) ** (-digits) or curv == 0:
                continue
            a = rr / curv
            u = [x + a * y for x, y in zip(u, p)]
            r = [x - a * lv * y for x, lv, y in zip(r, lam, p)]
            rr, beta = sum(x * x for x in r), sum(x * x for x in r) / rr
            p = [x + beta * y for x, y in zip(r, p)]
    return out


def _kappa_1000_batch():
    eig = [10 ** (-3 * i / 7) for i in range(8)]
    task = tasks.RegressionTask(n_dims=8, n_points=24, cov="rotated", eigenvalues=eig, seed=1)
    batch = task.sample(16, generator=torch.Generator().manual_seed(0))
    return batch.xs.double(), batch.ys.double()


def test_cg_is_exact_cg_on_ill_conditioned_prefixes():
    # κ 1000: the plain recurrence loses its residuals' orthogonality and drifts from CG by
    # 5e-3 of the predictions' scale at step 7 (2e-2 at step 8); reorthogonalized, CG's
    # iterates are exact CG's (50 digits) to round-off at every step, at prefixes of full
    # rank and of rank t < d (t = 3)
    xs, ys = _kappa_1000_batch()
    stats = algorithms.prefix_stats(xs, ys)
    it = algorithms.cg(xs, ys, range(10), weights=False)
    scale = algorithms.ols(xs, ys).preds.abs().max().item()
    for s in (0, 5, 11):
        for t in (3, 8, 9, 16, 23):
            ref = exact_cg(stats.eigvals[s, t], stats.xty_eig[s, t], stats.query_eig[s, t], 9)
            got = it.preds[:, s, t] / stats.y_scale
            assert max(abs(g - r) for g, r in zip(got.tolist(), ref)) < 1e-13 * scale


def test_cg_ends_at_ols_after_as_many_steps_as_the_rank():
    # exact CG has ended at OLS's min-norm solution after rank(S_t) steps: 8 from t = 8 on,
    # t before; from there the iterate is OLS's, bit for bit
    xs, ys = _kappa_1000_batch()
    ols = algorithms.ols(xs, ys).preds[0]
    it = algorithms.cg(xs, ys, [8, 9])
    assert torch.equal(it.preds, ols.expand_as(it.preds))
    short = algorithms.cg(xs, ys, [3])
    assert torch.equal(short.preds[0, :, :4], ols[:, :4])


def test_align_holds_no_prefix_statistics_once_it_returns(monkeypatch):
    """The blocks and terms kept for a batch's statistics held them (some 100 MB at Garg
    size) until another batch's replaced them; `align` now drops them when it is done."""
    from iclprobe.alignment import AlignConfig, align, pipeline
    from iclprobe.constructions.oracle import oracle
    from iclprobe.tasks import RegressionTask

    held = []
    real = prefix.forget_kept
    monkeypatch.setattr(pipeline, "forget_kept",
                        lambda: held.append(len(prefix._TERMS)) or real())
    model = oracle("gd", 3, 2, lambda layer: 2 * layer, task=RegressionTask(n_dims=3, n_points=8),
                   lr="max", normalize=True)
    align(model, AlignConfig(n_sequences=32, n_boot=10, separation=False,
                             algorithms=("gd", "newton")))
    assert held and held[0] > 0  # kept while it ran
    assert prefix._TERMS == [] and prefix._BLOCKS == []
