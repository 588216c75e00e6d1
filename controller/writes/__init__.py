"""What the controller writes, as pure functions from decisions to objects and patches."""
