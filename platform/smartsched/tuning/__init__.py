"""Ray Tune searches over reward weights (`smartsched tune`)."""
