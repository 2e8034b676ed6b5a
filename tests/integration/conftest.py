"""Session-wide runs that several modules here share (tests/integration/shared_runs.py)."""

from tests.integration.shared_runs import killed_rank_run, killed_rank_started  # noqa: F401
