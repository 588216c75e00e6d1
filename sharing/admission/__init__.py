"""The webhook's decision core: what a fractional request becomes, against a precomputed inventory."""
