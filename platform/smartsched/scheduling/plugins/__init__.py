"""Plugins: one small class per kube-scheduler or published-heuristic scoring rule."""
