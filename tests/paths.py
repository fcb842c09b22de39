"""Where the repository and the tests' own files are, for tests in any folder."""

from pathlib import Path

#: The tests folder (support modules, worker scripts, data/).
TESTS = Path(__file__).resolve().parent
#: The repository root (examples/, deploy/, adapters/ ...).
REPO = TESTS.parent
