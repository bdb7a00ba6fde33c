"""The search playground (GET /ui): one static page and its two assets, shipped in the package, served with a
Content-Security-Policy that allows scripts, styles and requests from this origin only (no inline script)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

UI_DIR = Path(__file__).parent / "ui"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ASSET_TYPES = {"playground.js": "text/javascript; charset=utf-8", "playground.css": "text/css; charset=utf-8"}
# Read once: a few kilobytes, and the page must load fast.
_PAGE = (UI_DIR / "index.html").read_bytes()
_ASSETS = {name: (UI_DIR / name).read_bytes() for name in ASSET_TYPES}

router = APIRouter(include_in_schema=False)


@router.get("/ui")
def page() -> Response:
    return Response(_PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/ui/assets/{name}")
def asset(name: str) -> Response:
    if name not in _ASSETS:
        raise HTTPException(status_code=404, detail=f"no asset {name!r}; the playground has {', '.join(ASSET_TYPES)}")
    return Response(_ASSETS[name], media_type=ASSET_TYPES[name], headers=HEADERS)
