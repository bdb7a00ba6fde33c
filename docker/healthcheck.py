"""Container health: exit 0 only when GET /ready answers 200 (the index is loaded)."""

import os
import sys
import urllib.request

# The service may bind a wildcard address; the check always asks over loopback.
host = os.environ.get("HYBRID_HOST", "127.0.0.1")
host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
url = f"http://{f'[{host}]' if ':' in host else host}:{os.environ.get('HYBRID_PORT', '8000')}/ready"
try:
    with urllib.request.urlopen(url, timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:
    print(f"{url}: {exc}", file=sys.stderr)
    sys.exit(1)
