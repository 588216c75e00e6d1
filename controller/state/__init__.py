"""The cycle's view of the cluster: value types, and building them from raw API objects (no client calls)."""
