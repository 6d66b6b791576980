"""The store: the one schema, engines, idempotent writes and reads into DataFrames."""
