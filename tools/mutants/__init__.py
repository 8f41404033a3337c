"""Mutants: changes made to the package on purpose, each of which some test must catch.

A test that stays green whatever the code does guards nothing. Each mutant here is a small, deliberate
defect (skip holding foreign inputs, drop a stream wait, send tied top_k scores to the higher index...)
with the tests that must fail on it. `python tools/mutants` applies each one to a copy of the checkout
(the built extension modules included; a changed .pyx, or C file of a CPU family, is rebuilt there), runs its killing tests in
that copy and reports the mutant as killed only if they fail. A mutant whose text is no longer found
exactly once is an error, not a pass: the code it guarded has moved and the mutant must follow it.

Mutants are declared one module per concept in this folder (`MUTANTS = [Mutant(...), ...]`), next to
the tests of that concept by name; `runner.py` holds the machinery.
"""
