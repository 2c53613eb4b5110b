"""Put the repository root on sys.path so `python scripts/x.py` works without `pip install -e .`."""
import sys
from pathlib import Path

root = str(Path(__file__).resolve().parent.parent)
if root not in sys.path:
    sys.path.insert(0, root)
