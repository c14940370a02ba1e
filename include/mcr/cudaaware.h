/* Whether the MPI library can read and write CUDA device memory.
 *
 * Open MPI answers through MPIX_Query_cuda_support() (mpi-ext.h), MPICH
 * through MPIX_GPU_query_support(). The answer is only a hint about the
 * build; mcr's Python layer lets MCR_CUDA_AWARE=0/1 override it.
 * Returns 1 (aware), 0 (not aware) or -1 (the library cannot tell).
 */
#ifndef MCR_CUDAAWARE_H
#define MCR_CUDAAWARE_H

#include <mpi.h>

#if defined(OPEN_MPI) && OPEN_MPI && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

static inline int mcr_mpi_cuda_aware(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() ? 1 : 0;
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return 0;                 /* Open MPI built without CUDA */
#elif defined(MPICH) && defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) != MPI_SUCCESS)
    return -1;
  return supported ? 1 : 0;
#else
  return -1;
#endif
}

#endif
