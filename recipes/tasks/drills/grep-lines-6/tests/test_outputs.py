from pathlib import Path

def test_grep():
    got = Path('/app/batch_70.txt').read_text().splitlines()
    assert got == ['FAIL indigo 44', 'FAIL alpha 297', 'FAIL ember 66']
