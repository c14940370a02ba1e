"""tinybackend: a backend for mcr defining only the primitives, on mpi4py."""

from mpi4py import MPI

from mcr.backends.base import Backend, Subcomm


class MpiWork:
    def __init__(self, request, *keep):
        self.request, self.keep = request, keep

    def is_completed(self):
        return self.request.Test()

    def wait(self):
        self.request.Wait()


def displacements(split):
    return [sum(split[:i]) for i in range(len(split))]


class TinySubcomm(Subcomm):
    def connect(self):
        self.mpi = self.comm.to_mpi4py().Dup()

    def disconnect(self):
        self.mpi.Free()

    def tensor_alltoall(self, output, input, output_split, input_split):
        send = [input.numpy(), (input_split, displacements(input_split)), MPI.BYTE]
        recv = [output.numpy(), (output_split, displacements(output_split)), MPI.BYTE]
        return MpiWork(self.mpi.Ialltoallv(send, recv), send, recv)

    def tensor_send(self, tensor, dest, tag):
        return MpiWork(self.mpi.Isend([tensor.numpy(), MPI.BYTE], dest, tag), tensor)

    def tensor_recv(self, tensor, source, tag):
        return MpiWork(self.mpi.Irecv([tensor.numpy(), MPI.BYTE], source, tag), tensor)


class TinyBackend(Backend):
    name = "tiny"
    devices = frozenset({"cpu"})
    subcomm = TinySubcomm
