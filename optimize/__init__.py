"""Compilation and evaluation of CRAG programs (teleprompters, threshold tuning, relevance data)."""
