"""The Kubernetes-style scheduling framework: filters, scorers, binders and profiles."""
