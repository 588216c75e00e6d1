"""What ``kubectl get`` shows of an object: the API server's Table rendering of its printer columns."""

from __future__ import annotations

import json
from typing import Any

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
"""The Accept header kubectl sends: the server renders the CRD's printer columns."""


def table_row(api: Any, path: str) -> dict[str, Any]:
    """The first row of the Table the API server renders for ``path``, by column name."""
    method, url, headers, _, _ = api.param_serialize("GET", path, header_params={"Accept": TABLE})
    response = api.call_api(method, url, header_params=headers)
    response.read()
    table = json.loads(response.data)
    columns = [c["name"] for c in table["columnDefinitions"]]
    return dict(zip(columns, table["rows"][0]["cells"]))
