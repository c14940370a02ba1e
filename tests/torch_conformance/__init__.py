"""torch's own distributed tests on the "mcr" backend (see report.py)."""
