"""The kernel emulator's gate: without a C++ compiler its tests must fail in CI, never skip."""
from mutants.mutant import Mutant

MUTANTS = [
]
