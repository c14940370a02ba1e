"""The one list of torch DistributedTest tests the conformance test does not run on "mcr".

A pattern is a test id (``distributed_test.test_name``) or an ``fnmatch`` pattern, with its
reason. Only tests whose subject mcr does not claim belong here (a failing test of what mcr
claims is a bug to fix). docs/conf.py renders this table into docs/pytorch.rst.
"""

EXCLUSIONS = []
