"""Benchmarks: the cost benchmark on spot traces, and the Lambda cold-start import time."""
