"""Sources of pods: public-trace loaders, synthetic generators and Parquet I/O."""
