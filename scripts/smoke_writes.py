"""docker_smoke.sh helper: `put` writes a document through the API, into the built index and into a collection it
creates; `check` finds both by id and by search (after `compose restart api`)."""

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
    assert call("POST", "/collections", {"name": "smoke-notes"})["documents"] == 0
    written = call("PUT", "/collections/smoke-notes/documents?wait=true", {"documents": [{"id": "note-1", "text": TEXT}]})
    assert written["visible"], written
else:
    for prefix, doc_id in (("", "smoke-1"), ("/collections/smoke-notes", "note-1")):
        assert call("GET", f"{prefix}/documents/{doc_id}")["text"] == TEXT
        hits = call("POST", f"{prefix}/search", {"query": "zebrafish smoke probe", "mode": "bm25", "k": 1})["hits"]
        assert hits and hits[0]["id"] == doc_id, hits
    print("a written document and a created collection survived `compose restart api`", file=sys.stderr)
