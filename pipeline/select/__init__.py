"""``python -m pipeline select``: views, datasets that keep some of another's documents by an
expression over its signal and metadata columns, without copying a token."""
