"""``python -m server_sync.schemas [DIR]``: regenerate the shipped JSON Schema files."""

import sys

from . import SCHEMA_DIR, write_schemas

for path in write_schemas(sys.argv[1] if len(sys.argv) > 1 else SCHEMA_DIR):
    print(path)
