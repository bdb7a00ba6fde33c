"""The storage engine the service and the command line drive: the registry of served collections (open, create,
drop, aliases, snapshots and restores, reload, the failed ones), what each serves now and its hot swaps (serving),
the model sessions collections share, bulk-load tasks, and what commands do to folders while no service runs
(offline). Importable without FastAPI: the HTTP service (app/) calls it, as the Ray deployment does through the
service, and the CLI (cli/)."""
