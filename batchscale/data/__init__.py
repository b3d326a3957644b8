"""Data prep: named datasets to Parquet shards with a manifest."""
