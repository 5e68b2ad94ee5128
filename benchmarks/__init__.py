"""Benchmarks of attention_course's fast paths (not part of the installed package).

Run ``python -m benchmarks --help`` from the repository root; see ``benchmarks/README.md``.
"""
