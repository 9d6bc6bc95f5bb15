"""Seed programs, shipped as data (``evolve.seeds``): read as text through
:mod:`evolve.resources` and checked in the sandbox; the programs are never imported."""
