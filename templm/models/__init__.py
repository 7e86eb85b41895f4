"""Language models: T5 v1.1 encoder-decoder (t5.py), Transformer-XL (transformer_xl.py) and the toy hidden Markov LM
with an exact marginal behind importance-sampled perplexity (hmm.py)."""
