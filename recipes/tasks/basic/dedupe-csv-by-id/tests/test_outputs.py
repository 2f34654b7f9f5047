from pathlib import Path

EXPECTED = ['id,name,email', '3,Carol,carol@x.io', '1,Alice,alice@x.io', '2,Bob,bob@x.io', '4,Dan,dan@x.io', '5,Eve,eve@x.io']
ORIGINAL = 'id,name,email\n3,Carol,carol@x.io\n1,Alice,alice@x.io\n2,Bob,bob@x.io\n1,Alice B.,alice.b@x.io\n4,Dan,dan@x.io\n3,Carol,carol@x.io\n5,Eve,eve@x.io\n2,Robert,robert@x.io\n'

def test_clean():
    lines = [l.strip() for l in Path("/app/clean.csv").read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

def test_source_untouched():
    assert Path("/app/records.csv").read_text() == ORIGINAL
