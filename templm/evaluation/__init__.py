"""Running models on data: seqio evaluation and inference of T5 checkpoints, per-example task evaluation, yearly
routing, future probes, static and dynamic evaluation of a token stream, the CALM online learner, importance-sampled
perplexity of the toy HMM."""
