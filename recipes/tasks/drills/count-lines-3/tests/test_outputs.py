from pathlib import Path

def test_output():
    p = Path('/app/ledger_91.txt')
    assert p.is_file(), '/app/ledger_91.txt is missing'
    assert p.read_text().strip() == '17'
