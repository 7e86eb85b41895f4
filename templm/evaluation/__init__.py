"""Evaluation: QA metrics, perplexity, calibration, yearly routing, dynamic evaluation, streaming analysis."""
