"""Storage under the data root: atomic writes, the layout of every product, object-store DuckDB, tar safety."""
