"""Cluster controller (kopf, watch caches): layout planning for pending demand, gate lifting."""
