"""Pure numbers: no model, no file I/O. QA scores, perplexities, time analyses, stream analyses, CALM metrics,
importance-sampling estimators."""
