"""Test-session setup. The suite is CPU-only: Triton kernels run in Triton's interpreter, which must be
chosen before anything imports triton (its standard library is built at import time)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def mini_engine(tmp_path_factory):
    """The default engine (``ocria-build engine``: the shipped ocria-mini pair, bf16), built once for the session.
    Tests read it; a test that changes an engine works on a copy."""
    from ocria.builder.engine import build_engine

    return build_engine(tmp_path_factory.mktemp("shared") / "mini", progress=False)
