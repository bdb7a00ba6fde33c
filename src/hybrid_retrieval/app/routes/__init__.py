"""The HTTP routes, one module per resource, each holding module-level routers by key role (app.security):
search, documents (and the compaction), collections, aliases, tasks, snapshots, operations (health, readiness,
metrics, reload). app.main mounts them; app.ui and app.api_docs hold the playground and the API docs."""
