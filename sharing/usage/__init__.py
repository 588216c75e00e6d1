"""Use, not only requests: reading per-pod GPU use (a GenTD26 usage trace) and, from it, right-sizing."""
