"""The operation matrix: every collective, in every form, on every backend.

One case per (operation, backend, form), each its own pytest test, e.g.
``collective[op=Allreduce,backend=gloo,form=persistent]``; inside it, every element type the
operation applies to (torch and numpy; for reductions every op on every type it applies to), both
roots, IN_PLACE and the vector layouts (uneven counts with zeros, gaps, reversed displacements);
outside the blocking form each type (or (type, op) pair) on one arrangement of root and IN_PLACE,
in turn. See :mod:`opmatrix` for the forms and backends, :mod:`opref` for the data and expected
values. The quick tier (``-m quick``) runs each operation blocking on each backend at 2 processes.
"""

from mpiharness import case, mpi_cases
from opmatrix import BACKENDS, FORMS, OPERATIONS, run_operation


@case.matrix(op=tuple(OPERATIONS), backend=BACKENDS, form=FORMS,
             quick=lambda op, backend, form: form == "blocking")
def collective(comm, op, backend, form):
    run_operation(comm, op, backend, form)


test_mpi = mpi_cases(__name__)
