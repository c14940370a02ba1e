import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "quick: the quick tier (python -m pytest -m quick): one case of each "
        "operation on each backend at 2 processes")


@pytest.hookimpl(trylast=True)     # after -k and -m have deselected
def pytest_collection_modifyitems(session, config, items):
    import mpiharness
    mpiharness.select(items)
