"""The interactive API docs (GET /docs): Swagger UI 5 (which reads the OpenAPI 3.1 FastAPI writes) served from the
package `swagger-ui-bundle-v2` (Apache-2.0), not from a CDN, so the page works on a machine without internet."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from swagger_ui_bundle import swagger_ui_path

ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
_ASSETS: dict[str, bytes] = {}  # read on first use: 1.2 MB the service needs only when someone opens /docs

router = APIRouter(include_in_schema=False)


@router.get("/docs")
def docs(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - API docs",
        swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png",
    )


@router.get("/docs/assets/{name}")
def asset(name: str) -> Response:
    if name not in ASSET_TYPES:
        raise HTTPException(status_code=404, detail=f"no asset {name!r}; the API docs have {', '.join(ASSET_TYPES)}")
    if name not in _ASSETS:
        _ASSETS[name] = (swagger_ui_path / name).read_bytes()
    return Response(_ASSETS[name], media_type=ASSET_TYPES[name], headers={"Cache-Control": "max-age=86400"})
