"""Trace simulator: replays Alibaba openb pod traces under the FGD paper's protocol."""
