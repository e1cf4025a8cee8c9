import pytest

from gnn_policy.atomic import replacing, write_text


def test_write_text_replaces_and_leaves_no_partial(tmp_path):
    path = tmp_path / "deep" / "card.json"
    write_text(path, "one")
    write_text(path, "two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["card.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "card.json"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="disk full"):
        with replacing(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["card.json"]
