"""docker_smoke.sh helper: `put` writes a document through the API; `check` finds it by id and by search."""

import json
import sys
import urllib.request

port, step = sys.argv[1], sys.argv[2]
HEADERS = {"X-API-Key": "smoke-writer", "content-type": "application/json"}
TEXT = "zebrafish regeneration smoke probe"


def call(method: str, path: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=HEADERS, method=method)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


if step == "put":
    written = call("PUT", "/documents?wait=true", {"documents": [{"id": "smoke-1", "text": TEXT}]})
    assert written["visible"], written
else:
    assert call("GET", "/documents/smoke-1")["text"] == TEXT
    hits = call("POST", "/search", {"query": "zebrafish smoke probe", "mode": "bm25", "k": 1})["hits"]
    assert hits and hits[0]["id"] == "smoke-1", hits
    print("a written document survived `compose restart api`", file=sys.stderr)
