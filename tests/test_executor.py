"""The executor: memory plan (one arena by liveness), re-planning when dims change, rebuilding after graph edits,
and donated inputs that a Scatter updates in place."""
import numpy as np
import pytest

import luminal as lm


def chain(cx, x, n):
    for i in range(n):
        x = (x * 0.5 + 0.25).sqrt() if i % 2 else (x - 0.25).exp2()
    return x


def test_intermediates_share_the_arena(rng):
    cx = lm.Graph()
    data = rng.data((64, 64), "pos").astype(np.float32)
    x = cx.tensor((64, 64)).set(data)
    out = chain(cx, x, 20).output()
    cx.execute()
    want = data.astype(np.float64)
    for i in range(20):
        want = np.sqrt(want * 0.5 + 0.25) if i % 2 else np.exp2(want - 0.25)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)
    # Fifty 16 KiB intermediates, each dead once the next is made: three slots (and the constants) suffice.
    assert cx._executor.arena_bytes <= 3 * 64 * 64 * 4 + 4096


def test_replans_when_dims_change_and_rebuilds_after_edits(rng):
    cx = lm.Graph()
    x = cx.tensor(("n", 8))
    y = (x.softmax(-1) * 2).sum(0).output()
    for n in (5, 17, 3):
        data = rng.data((n, 8)).astype(np.float32)
        x.set(data)
        cx.execute()
        e = np.exp(data - data.max(-1, keepdims=True))
        np.testing.assert_allclose(y.numpy(), (e / e.sum(-1, keepdims=True) * 2).sum(0), rtol=1e-5)
    z = (y + 1).output()  # an edit after executing: the executor rebuilds its schedule
    cx.execute()
    np.testing.assert_allclose(z.numpy(), y.numpy() + 1, rtol=1e-6)
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    cx.execute()
    np.testing.assert_allclose(z.numpy(), y.numpy() + 1, rtol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["reference", "cpu"])
def test_donated_input_is_updated_in_place(rng, compiled):
    cx = lm.Graph()
    cache = cx.tensor(("c", 3))
    pos = cx.tensor(("s",), lm.int32)
    new = cx.tensor(("s", 3))
    out = cache.index_copy(0, pos, new)
    total = out.sum().output()
    out = out.output()
    if compiled:
        cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    buf = rng.data((10, 3)).astype(np.float32)
    keep = buf.copy()
    rows = rng.data((2, 3)).astype(np.float32)
    cache.set(buf)  # not donated: left alone
    pos.set(np.array([4, 7], np.int32))
    new.set(rows)
    cx.execute()
    np.testing.assert_array_equal(buf, keep)
    want = keep.copy()
    want[[4, 7]] = rows
    np.testing.assert_array_equal(out.numpy(), want)
    assert not np.shares_memory(out.numpy(), buf)

    cache.set(buf, donate=True)
    cx.execute()
    np.testing.assert_array_equal(buf, want)  # written in place
    assert np.shares_memory(out.numpy(), buf)
    np.testing.assert_allclose(total.numpy(), want.sum(dtype=np.float64), rtol=1e-5)


def test_donation_is_ignored_when_another_op_reads_the_input(rng):
    cx = lm.Graph()
    cache = cx.tensor((6, 2))
    out = cache.index_copy(0, cx.tensor((1,), lm.int32).set(np.array([2], np.int32)),
                           cx.tensor((1, 2)).set(np.ones((1, 2), np.float32))).output()
    other = (cache * 2).output()  # reads the old contents: the Scatter must not overwrite them first
    buf = rng.data((6, 2)).astype(np.float32)
    keep = buf.copy()
    cache.set(buf, donate=True)
    cx.execute()
    np.testing.assert_array_equal(buf, keep)
    np.testing.assert_array_equal(other.numpy(), keep * 2)
    assert out.numpy()[2].tolist() == [1.0, 1.0]
