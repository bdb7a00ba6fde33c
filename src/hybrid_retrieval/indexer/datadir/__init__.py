"""A data directory of named collections (layout: create, drop, aliases) and a collection's settings (settings)."""
