"""Language models: T5 v1.1 encoder-decoder (t5.py) and Transformer-XL (transformer_xl.py)."""
