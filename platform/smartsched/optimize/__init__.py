"""Joint placement of a window of pods: the quantum-inspired annealer and its exact reference.

``problem`` (the model every solver reads), ``candidates`` (a profile's filters and
scores, pruned, into that model), ``annealer`` (simulated annealing / parallel
tempering in numpy), ``repair`` (feasible, then ejection chains), ``exact``
(HiGHS), ``placer`` (a window checked on the twin, and the ``anneal:`` scheduler).
See docs/optimize.md.
"""
