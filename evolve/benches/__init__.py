"""Benchmarks as PrisMem uses them: the registry of benches and the guard sets drawn from them."""
