import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mutants.runner import main  # noqa: E402  (tools/ on the path first: this folder is run as a script)

sys.exit(main())
