"""Markdown tables, verdicts and PNG figures from results dicts (no model, no training)."""
