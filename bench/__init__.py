"""Benchmarks and the real-photo JPEG corpora they (and the tests) run on."""
