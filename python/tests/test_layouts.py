"""Where a kernel's outputs live in memory: an elementwise output (dims that are
exactly the inputs' ``...S`` group) follows the inputs' memory order, as torch's
TensorIterator and NumPy's ufuncs (``order='K'``) lay out theirs; everything
else, and ``copy``, is row-major. Checked against torch's and NumPy's own
answers for the same operands, and through every allocator (torch's exchange
allocator, ``numpy.empty``, ``dlbridge.Array``, the torch operator's fake)."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dlbridge
import dlbridge.torch as dt
from torch._subclasses.fake_tensor import FakeTensorMode

add, sub, relu, gelu = (dlbridge.get_kernel(k) for k in ("add", "sub", "relu", "gelu"))


def _layout(draw, shape):
    """A tensor of logical ``shape`` in a drawn layout: a permutation of a
    contiguous base, maybe sliced with a step, maybe a broadcast dim."""
    n = len(shape)
    perm = draw(st.permutations(range(n)))
    step = draw(st.sampled_from([1, 1, 2]))
    base_shape = [shape[p] for p in perm]
    base_shape[-1] *= step
    base = torch.randn(base_shape)
    if step > 1:
        base = base[..., ::step]
    inv = [perm.index(d) for d in range(n)]
    t = base.permute(inv)
    if draw(st.booleans()):  # broadcast one dim: stride 0
        d = draw(st.integers(0, n - 1))
        t = t.narrow(d, 0, 1).expand(shape)
    assert tuple(t.shape) == tuple(shape)
    return t


@st.composite
def operands(draw):
    n = draw(st.integers(2, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    return _layout(draw, shape), _layout(draw, shape)


def _strides(t):
    """The strides of the dims that have a place in memory (a size-1 dim's
    stride is arbitrary, and torch's own ops do not agree on it)."""
    return tuple(s if n != 1 else None for n, s in zip(t.shape, t.stride()))


@settings(max_examples=300, deadline=None)
@given(operands())
def test_elementwise_outputs_have_the_strides_torch_gives_its_own(ab):
    a, b = ab
    got, want = add(a, b), a + b
    assert _strides(got) == _strides(want), (a.stride(), b.stride())
    assert torch.equal(got, want)
    got, want = relu(a), torch.relu(a)
    assert _strides(got) == _strides(want), a.stride()
    assert torch.equal(got, want)


def test_the_issue_case_add_of_two_transposed_operands_keeps_their_layout():
    x = torch.randn(1024, 4096)
    y = add(x.t(), x.t())
    assert y.stride() == (1, 4096) == (x.t() + x.t()).stride()
    assert torch.equal(y, x.t() * 2)
    # A contiguous first operand decides for a mixed pair, as torch's `+` does.
    c = x.t().contiguous()
    assert add(c, x.t()).stride() == (c + x.t()).stride() == (1024, 1)
    assert add(x.t(), c).stride() == (x.t() + c).stride() == (1, 4096)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(12.0).reshape(3, 4).T,
        lambda: np.asfortranarray(np.arange(24.0).reshape(2, 3, 4)),
        lambda: np.arange(24.0).reshape(2, 3, 4).transpose(2, 0, 1),
        lambda: np.arange(24.0).reshape(4, 6)[::-1],
    ],
    ids=["transposed", "fortran", "permuted", "flipped"],
)
def test_numpy_outputs_have_the_strides_numpy_ufuncs_give(make):
    a = make()
    got = add(a, a)
    assert isinstance(got, np.ndarray)
    assert got.strides == np.add(a, a).strides
    np.testing.assert_array_equal(got, a + a)
    assert relu(a).strides == np.maximum(a, 0).strides


def test_a_dlbridge_array_output_follows_too():
    a = dlbridge.from_dlpack(np.arange(12.0, dtype=np.float32).reshape(3, 4)).T
    y = relu(a)
    assert isinstance(y, dlbridge.Array)
    assert y.shape == (4, 3) and y.strides == a.strides
    np.testing.assert_array_equal(np.from_dlpack(y), np.arange(12.0, dtype=np.float32).reshape(3, 4).T)


def test_bf16_torch_and_the_array_fallback_follow_too():
    x = torch.randn(8, 5, dtype=torch.bfloat16).t()
    assert gelu(x).stride() == torch.nn.functional.gelu(x).stride() == (1, 5)
    torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x), atol=2e-2, rtol=2e-2)


def test_softmax_follows_its_input_and_copy_and_matmul_stay_row_major():
    # softmax's output is shaped like its input ([...B, N]): it follows it, with
    # torch's values (torch's own softmax returns a row-major result); matmul's
    # output is shaped like no input.
    x = torch.randn(300, 70).t()
    y = dlbridge.get_kernel("softmax")(x)
    assert y.stride() == x.stride() == (1, 70)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    z = torch.randn(4, 300, 70, dtype=torch.bfloat16).transpose(1, 2)
    y = dlbridge.get_kernel("softmax")(z)
    assert y.stride() == z.stride()
    torch.testing.assert_close(y, torch.softmax(z, -1), atol=1e-2, rtol=1e-2)
    assert dlbridge.get_kernel("copy")(x).is_contiguous()
    assert dlbridge.get_kernel("matmul")(x, torch.randn(300, 5).t().contiguous().t()).is_contiguous()
    assert not dlbridge.get_kernel("copy").outputs_follow_inputs
    assert add.outputs_follow_inputs and relu.outputs_follow_inputs


def test_given_outputs_keep_their_own_layout():
    x = torch.randn(6, 4).t()
    out = torch.empty(4, 6)
    ptr = out.data_ptr()
    add(x, x, out=out)
    assert out.is_contiguous() and out.data_ptr() == ptr and torch.equal(out, x * 2)


def test_the_torch_operator_fake_gives_the_strides_the_kernel_gives():
    ops = dt.register_all()
    cases = [
        ("add", (torch.randn(5, 3).t(), torch.randn(5, 3).t())),
        ("add", (torch.randn(3, 5), torch.randn(5, 3).t())),
        ("relu", (torch.randn(2, 3, 4).permute(2, 0, 1),)),
        ("gelu", (torch.randn(4, 1, 3).permute(1, 2, 0),)),
        ("copy", (torch.randn(5, 3).t(),)),
        ("softmax", (torch.randn(5, 3).t(),)),
    ]
    for name, args in cases:
        real = ops[name](*args)
        with FakeTensorMode() as mode:
            fake = ops[name](*(mode.from_tensor(a) for a in args))
        assert fake.stride() == real.stride(), name
        assert real.stride() == dlbridge.get_kernel(name)(*args).stride(), name
    # torch.compile checks the fake's strides against the kernel's (size/stride asserts).
    f = torch.compile(lambda a: ops["relu"](ops["add"](a, a)), backend="aot_eager", fullgraph=True)
    x = torch.randn(6, 4).t()
    y = f(x)
    assert y.stride() == (1, 4) and torch.equal(y, torch.relu(x + x))


def test_row_major_operands_still_get_row_major_outputs():
    for shape in [(1,), (3,), (2, 3)]:
        x = torch.randn(shape)
        assert add(x, x).is_contiguous()
    for a, b in itertools.product([torch.randn(4, 3)], [torch.randn(4, 3), torch.randn(3, 4).t()]):
        assert add(a, b).is_contiguous()
