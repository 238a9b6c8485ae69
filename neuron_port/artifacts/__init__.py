"""Layer ``artifacts``: a compiled port on disk.

The manifest and its verification (``manifest``), writing every rank's graphs and the host files
(``writer``), and reading one rank's port back without a model (``reader``).
"""
