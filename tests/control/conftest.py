"""Make ``control_jsonschema`` importable from the ``test_control_*`` modules (importlib mode)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
