"""Make ``call_harness`` importable from the ``test_call_*`` modules (importlib import mode)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
