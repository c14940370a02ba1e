"""Smoke test of the harness: a case that must pass at every world size."""

import torch

from mpiharness import case, mpi_cases
from util import all_data, assert_equal


@case.quick
def allreduce_sum_float32(comm):
    data = all_data(comm.size, 10)
    out = torch.zeros(10)
    comm.Allreduce(data[comm.rank], out)
    assert_equal(out, torch.stack(data).sum(0))


test_mpi = mpi_cases(__name__)
