"""What the bytes of a dataset mean: object names, ``manifest.json``, the row-group index,
checksums, token encoding, typed reading of untrusted JSON. Pure: parses and builds bytes it
is given, imports nothing else of ``storage`` (no I/O; that is :mod:`storage.io`)."""
