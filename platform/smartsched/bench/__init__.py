"""Side-by-side evaluation: run reports, comparison tables and benchmark suites."""
