"""Mutating/validating admission webhook (FastAPI wiring around ``sharing`` decisions)."""
