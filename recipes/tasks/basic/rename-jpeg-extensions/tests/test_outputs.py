from pathlib import Path

D = Path("/app/images")

def test_renamed():
    assert (D / "cat.jpg").read_text() == "cat\n"
    assert (D / "dog.jpg").read_text() == "dog\n"
    assert (D / "summer trip.jpg").read_text() == "beach\n"

def test_no_jpeg_left_at_top_level():
    assert sorted(p.name for p in D.glob("*.jpeg")) == []

def test_others_untouched():
    assert (D / "logo.png").read_text() == "png\n"
    assert (D / "notes.txt").read_text() == "jpeg is a format\n"
    assert (D / "raw" / "sunset.jpeg").read_text() == "nested, leave alone\n"
    assert not (D / "raw" / "sunset.jpg").exists()
