"""What a mutant is: one textual change to one file of the package, and the tests that must catch it."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    name: str            # unique, short: shown in the report and accepted on the command line
    why: str             # the defect it stands for (the issue item it comes from)
    path: str            # file to change, relative to the repository root
    find: str            # text that must occur exactly once in that file...
    replace: str         # ...and what it becomes
    kill: tuple[str, ...]  # pytest node ids (or files) of which at least one must fail on the mutant
    env: dict[str, str] = field(default_factory=dict)   # extra environment for the killing run
    pytest_args: tuple[str, ...] = ()                    # e.g. ("-k", "not half")

    def apply(self, text: str) -> str:
        n = text.count(self.find)
        if n != 1:
            raise ValueError(f"mutant {self.name}: its text occurs {n} times in {self.path} (must be once): "
                             "the code it guards has changed; update the mutant")
        return text.replace(self.find, self.replace)
