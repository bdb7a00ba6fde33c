"""The storage engine the service drives: the registry of served collections (open, create, drop, aliases,
snapshots and restores, reload, the failed ones), what each serves now and its hot swaps (serving), the model
sessions collections share, and bulk-load tasks. Importable without FastAPI: the HTTP service (app/) calls it, as
the Ray deployment does through the service."""
