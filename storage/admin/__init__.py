"""What admin tools and commits do: versions and the commit, ``verify``/``repair``, ``gc``,
``upgrade``, and ``python -m storage``. Imports :mod:`storage.format` and :mod:`storage.io`."""
