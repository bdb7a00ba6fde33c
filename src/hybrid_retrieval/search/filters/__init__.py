"""Metadata filters: typed columns built at index time, and a MongoDB-style filter language over them.

types     the field types a metadata value gives its field (inference), and the checks a written value passes
columns   the filterable fields' columns: built from a corpus (MetadataCollector), stored, counted for facets
language  the filter grammar: checking a filter against the fields and evaluating it over the columns
"""
