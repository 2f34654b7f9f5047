from pathlib import Path

def test_tail():
    assert Path('/app/sample_41.txt').read_text().splitlines() == ['saffron maple 53', 'saffron ember 976', 'lantern lantern 299', 'umber juniper 331', 'pepper copper 414']
