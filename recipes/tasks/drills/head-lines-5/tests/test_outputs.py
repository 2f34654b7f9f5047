from pathlib import Path

def test_head():
    assert Path('/app/manifest_51.txt').read_text().splitlines() == ['lantern saffron 651', 'alpha copper 133', 'meadow ember 182', 'quartz cedar 139', 'zephyr garnet 801']
