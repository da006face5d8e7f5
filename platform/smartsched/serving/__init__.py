"""The placement service on Ray Serve: HTTP ingress, cloud/region/edge tiers."""
