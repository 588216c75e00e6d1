"""Pure planning: which gated pods go where and what capacity to create (no I/O)."""
