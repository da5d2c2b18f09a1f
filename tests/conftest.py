"""Test-session setup. The suite is CPU-only: Triton kernels run in Triton's interpreter, which must be
chosen before anything imports triton (its standard library is built at import time)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
