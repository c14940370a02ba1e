"""The one list of torch DistributedTest tests the conformance test does not run on "mcr".

A pattern is a test id (``distributed_test.test_name``) or an ``fnmatch``
pattern, with its reason. Only tests whose subject mcr does not claim belong
here; a failing test of something mcr claims is an mcr bug to fix, not an
exclusion. docs/conf.py renders this table into docs/pytorch.rst.
"""

EXCLUSIONS = [
]
