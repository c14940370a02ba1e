/* Which shared library an MPI symbol was resolved from.
 *
 * mcr and mpi4py must call the same libmpi. mcr_libmpi_path() names the file
 * that provides MPI_Get_library_version to mcr; mcr_same_symbol() checks that
 * the copy of mpi4py's extension module sees the very same function.
 */
#ifndef MCR_LIBCHECK_H
#define MCR_LIBCHECK_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <mpi.h>
#include "mcr_buildinfo.h"

static const char *mcr_path_of(void *addr)
{
  Dl_info info;
  if (addr && dladdr(addr, &info) && info.dli_fname) return info.dli_fname;
  return "";
}

static const char *mcr_libmpi_path(void) { return mcr_path_of((void *)&MPI_Get_library_version); }

/* Path of the libmpi that the module at `module_path` (already loaded) uses. */
static const char *mcr_libmpi_path_of_module(const char *module_path)
{
  const char *path = "";
  void *handle = dlopen(module_path, RTLD_LAZY | RTLD_NOLOAD);
  if (handle) {
    path = mcr_path_of(dlsym(handle, "MPI_Get_library_version"));
    dlclose(handle);
  }
  return path;
}

static int mcr_same_libmpi(const char *module_path)
{
  int same = 0;
  void *handle = dlopen(module_path, RTLD_LAZY | RTLD_NOLOAD);
  if (handle) {
    same = dlsym(handle, "MPI_Get_library_version") == (void *)&MPI_Get_library_version;
    dlclose(handle);
  }
  return same;
}

#endif /* MCR_LIBCHECK_H */
