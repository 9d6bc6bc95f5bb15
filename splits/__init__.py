"""Split files, shipped as data (``evolve.splits``): read through :mod:`evolve.resources`."""
