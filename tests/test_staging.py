"""``staged_directory``: the destination appears whole or not at all, and a failure leaves the old one intact."""

import pytest

from ocria.staging import staged_directory


def test_directory_appears_whole_replaces_the_old_and_survives_a_failure(tmp_path):
    out = tmp_path / "a" / "engine"
    with staged_directory(out) as tmp:
        (tmp / "f").write_text("one")
        assert not out.exists()  # nothing at the destination while it is being written
    assert (out / "f").read_text() == "one"
    with staged_directory(out) as tmp:
        (tmp / "g").write_text("two")
    assert sorted(p.name for p in out.iterdir()) == ["g"]  # replaced, not merged
    with pytest.raises(RuntimeError), staged_directory(out) as tmp:
        (tmp / "h").write_text("half")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in out.iterdir()) == ["g"]  # the old directory is left as it was
    assert sorted(p.name for p in out.parent.iterdir()) == ["engine"]  # no temporary or old copy is left behind
