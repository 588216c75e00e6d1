"""Cluster controller (kopf): layout planning for pending demand, gate lifting, utilisation feedback."""
