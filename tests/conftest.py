"""Suite-wide settings.

OpenMP threads that spin while waiting make torch 2-10x slower on a shared 2-core machine, so
they must be told to sleep before torch is first imported.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
