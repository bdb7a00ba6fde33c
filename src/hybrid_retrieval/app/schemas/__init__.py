"""Request and response bodies of the HTTP API, one module per resource (search, documents, collections, snapshots,
operations) and what they share."""
