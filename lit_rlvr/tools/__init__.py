"""Command-line tools beside ``fit``/``validate``: ``lit-rlvr cache`` and ``lit-rlvr report``.

Tools sit at the top of the data flow: they import from the rest of the package, and nothing in
the package imports them (the ``lit-rlvr`` entry point loads them by name).
"""
