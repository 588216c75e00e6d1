"""gpupack command line and developer tooling (entry points that wire the other packages)."""

__version__ = "0.1.0"
