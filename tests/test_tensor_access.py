"""Reading torch tensors: the C-shim fast path agrees with the Python API.

mcr reads plain tensors through torch's stable C shim (src/mcr/core/astensor.pxi) and anything
unusual through torch's Python API: many kinds of tensors move here.
"""

import pytest
import torch

import mcr
from mcr import _core
from opref import MOVE

SELF = mcr.COMM_SELF


def roundtrip(t):
    out = torch.empty(t.numel(), dtype=t.dtype)
    SELF.Sendrecv(t, 0, 0, out, 0, 0)
    return out


def test_fast_path_is_active_with_this_torch():
    torch.ones(1) + 0          # any tensor: mcr binds torch on first use
    SELF.Allreduce(torch.ones(1), torch.zeros(1))
    assert _core._fast_tensor_path(), (
        "torch's C shim or tensor layout did not check out: mcr reads tensors through "
        f"the slower Python API with torch {torch.__version__}")


@pytest.mark.parametrize("dtype", MOVE, ids=str)
def test_views_and_offsets(dtype):
    base = (torch.arange(60) % 7).to(dtype)
    for t in [base, base[5:17], base.view(3, 4, 5)[1], base.view(6, 10)[2:4],
              base.view(6, 10)[:, 3:4].squeeze(1).contiguous(), base[59:], base[:0],
              base[7].clone()]:
        assert torch.equal(roundtrip(t), t.reshape(-1)), t.shape


class Sub(torch.Tensor):
    pass


def test_autograd_parameters_inference_and_subclasses():
    leaf = torch.arange(4.0, requires_grad=True)
    with torch.inference_mode():
        inference = torch.arange(5.0)
    for t in [leaf, torch.nn.Parameter(torch.arange(3.0)), inference,
              torch.arange(6.0).as_subclass(Sub), leaf * 2]:
        assert torch.equal(roundtrip(t), t.detach().as_subclass(torch.Tensor)), type(t)


def test_receive_into_views_writes_the_right_memory():
    base = torch.zeros(10)
    SELF.Sendrecv(torch.arange(3.0), 0, 0, base[4:7], 0, 0)
    assert base.tolist() == [0, 0, 0, 0, 0, 1, 2, 0, 0, 0]


@pytest.mark.parametrize("make, exc, fragment", [
    (lambda: torch.arange(8.0)[::2], BufferError, "not contiguous"),
    (lambda: torch.ones(3, 4).t(), BufferError, "not contiguous"),
    (lambda: torch.ones(1).expand(4), BufferError, "not contiguous"),
    (lambda: torch.ones(2, 3, 4, 5).to(memory_format=torch.channels_last), BufferError,
     "not contiguous"),
    (lambda: torch._neg_view(torch.ones(3)), BufferError, "negative bit"),
    (lambda: torch.ones(3, dtype=torch.complex128).conj(), BufferError, "conjugate bit"),
    (lambda: torch.ones(3).to_sparse(), TypeError, "layout torch.sparse_coo"),
    (lambda: torch.ones(2, 2).to_sparse_csr(), TypeError, "layout torch.sparse_csr"),
    (lambda: torch.ones(3).to_mkldnn(), TypeError, "layout torch._mkldnn"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), TypeError,
     "nested tensor with layout torch.strided"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
     TypeError, "nested tensor with layout torch.jagged"),
    (lambda: torch._efficientzerotensor(3), BufferError, "3 elements has no memory"),
    (lambda: torch.empty(3, device="meta"), TypeError, "device meta"),
    (lambda: torch.zeros(3, dtype=torch.float8_e4m3fn), TypeError, "dtype torch.float8_e4m3fn"),
])
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors",
                            "ignore:Sparse CSR tensor support")
def test_rejected_tensors(make, exc, fragment, backend):
    t = make()
    with pytest.raises(exc, match=fragment):
        SELF.Send(t, mcr.PROC_NULL, backend=backend)
    with pytest.raises(exc, match=fragment):              # (a receive buffer too)
        SELF.Allreduce(torch.ones(3), t, backend=backend)
    SELF.Allreduce(torch.ones(2), torch.zeros(2), backend=backend)     # still usable
