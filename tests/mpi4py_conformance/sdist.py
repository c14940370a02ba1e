"""Find mpi4py's own test suite (and its demo programs) for the installed mpi4py version.

mpi4py's wheels do not ship them; its sdist does (``test/``, ``demo/``). The sdist of the
installed version is fetched once with pip and kept unpacked in
``$XDG_CACHE_HOME/mcr/mpi4py-<version>/`` (``~/.cache/mcr/...`` by default).
``MCR_MPI4PY_SDIST`` may name a local sdist (``.tar.gz``) or an unpacked tree instead.
"""

import atexit
import contextlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading

ENV_VAR = "MCR_MPI4PY_SDIST"


def installed_version():
    return importlib.metadata.version("mpi4py")


class SuiteUnavailable(RuntimeError):
    """mpi4py's test suite could not be found or fetched."""


def cache_dir(version):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mcr", f"mpi4py-{version}")


def how_to_provide(version):
    return (f"Provide it by hand: `pip download mpi4py=={version} --no-binary :all: "
            f"--no-deps -d DIR` on a machine with access to the package index, then "
            f"set {ENV_VAR}=DIR/mpi4py-{version}.tar.gz (or to the unpacked tree), or "
            f"unpack it into {cache_dir(version)}/ so that its test/main.py is there.")


def demo_dir():
    """The folder of mpi4py's demo programs, beside the test suite (:func:`test_dir`)."""
    tests = test_dir()
    found = os.path.join(os.path.dirname(tests), "demo")
    if not os.path.isdir(found):
        raise SuiteUnavailable(f"no demo/ folder beside mpi4py's test suite in {tests}: give "
                               f"{ENV_VAR} the whole sdist. {how_to_provide(installed_version())}")
    return found


def find_test_dir(tree):
    """The folder holding mpi4py's test/main.py in an unpacked sdist, or None."""
    for candidate in (tree, os.path.join(tree, "test")):
        if os.path.isfile(os.path.join(candidate, "main.py")) and \
                os.path.isfile(os.path.join(candidate, "mpiunittest.py")):
            return candidate
    for entry in sorted(os.listdir(tree)) if os.path.isdir(tree) else ():
        found = os.path.join(tree, entry, "test")
        if os.path.isfile(os.path.join(found, "main.py")):
            return found
    return None


def unpack(archive, dest):
    """Unpack the sdist `archive` into `dest` (created atomically)."""
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
    try:
        with tarfile.open(archive) as tar:  # no filter on Python < 3.12 without the backport
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        try:
            os.rename(tmp, dest)
        except OSError:  # another process unpacked it first
            if find_test_dir(dest) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download(version, dest_dir):
    """`pip download` the sdist of mpi4py `version` into `dest_dir`; its path."""
    cmd = [sys.executable, "-m", "pip", "download", f"mpi4py=={version}", "--no-binary", ":all:",
           "--no-deps", "--disable-pip-version-check", "-d", dest_dir]
    try:
        pip = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise SuiteUnavailable(f"`{' '.join(cmd)}` failed: {exc}") from exc
    # at the lowest priority (prefetch runs it beside the MPI jobs; set from here, as a
    # preexec_fn is unsafe in a thread), before pip starts its build back-end; ended at exit
    # if it still runs then (a prefetch that no test waited for)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pip.pid, 19)
    atexit.register(pip.kill)
    try:
        output, _ = pip.communicate(timeout=600)
    except subprocess.TimeoutExpired as exc:
        pip.kill()
        pip.wait()
        raise SuiteUnavailable(f"`{' '.join(cmd)}` failed: {exc}") from exc
    finally:
        atexit.unregister(pip.kill)
    archives = [f for f in os.listdir(dest_dir) if f.endswith((".tar.gz", ".zip"))]
    if pip.returncode != 0 or not archives:
        raise SuiteUnavailable(f"`{' '.join(cmd)}` failed (exit {pip.returncode}):\n"
                               f"{output.strip()[-2000:]}")
    return os.path.join(dest_dir, archives[0])


_prefetch = {}       # "thread": the fetch started by prefetch(), then "result" or "error"


def prefetch():
    """Start :func:`test_dir` in a thread (a test module's ``start_early``), so that a
    download, which mostly waits on the network, runs while the MPI jobs before it do."""
    def fetch():
        try:
            _prefetch["result"] = _find_or_fetch()
        except BaseException as exc:        # (re-raised by test_dir in the caller's thread)
            _prefetch["error"] = exc
    if not _prefetch:
        _prefetch["thread"] = threading.Thread(target=fetch, name="mpi4py-sdist", daemon=True)
        _prefetch["thread"].start()


def test_dir():
    """The folder of mpi4py's test suite for the installed mpi4py version (what
    :func:`prefetch` found, once it has).

    Raises
    ------
    SuiteUnavailable
        When neither ``MCR_MPI4PY_SDIST``, the cache nor the package index gives it; the
        message says how to provide it.
    """
    if _prefetch:
        _prefetch["thread"].join()
        if "error" in _prefetch:
            raise _prefetch["error"]
        return _prefetch["result"]
    return _find_or_fetch()


def _find_or_fetch():
    version = installed_version()
    cached, local = cache_dir(version), os.environ.get(ENV_VAR)
    if local:
        found = find_test_dir(local) if os.path.isdir(local) else None
        if os.path.isfile(local):
            found = find_test_dir(cached)
            if found is None:
                unpack(local, cached)
                found = find_test_dir(cached)
        if found is None:
            raise SuiteUnavailable(f"{ENV_VAR}={local} is not an mpi4py sdist or an unpacked "
                                   f"tree with test/main.py. {how_to_provide(version)}")
        return found
    found = find_test_dir(cached) if os.path.isdir(cached) else None
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(prefix="mcr-mpi4py-sdist-") as tmp:
        try:
            archive = download(version, tmp)
            unpack(archive, cached)
        except (SuiteUnavailable, OSError, tarfile.TarError) as exc:
            raise SuiteUnavailable(f"cannot fetch mpi4py {version}'s test suite from the "
                                   f"package index: {exc}\n{how_to_provide(version)}") from exc
    found = find_test_dir(cached)
    if found is None:
        raise SuiteUnavailable(f"the sdist of mpi4py {version} unpacked in {cached} has no "
                               f"test/main.py. {how_to_provide(version)}")
    return found
