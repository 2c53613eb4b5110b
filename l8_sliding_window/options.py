"""Stage 8 adds no option: the checkpoint says which layers are windowed (l1_dense/config.py)."""
from l7_fast.options import ENGINE_OPTIONS as BEFORE

OPTIONS = ()

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
