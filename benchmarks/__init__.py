"""Benchmarks: each prints ratios against a baseline measured in the same run (``make bench``)."""
