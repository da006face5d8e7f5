"""Carbon-aware scheduling (issue 20): forecasting grid intensity from its past and
shifting deferrable work to cleaner hours without missing a deadline."""
