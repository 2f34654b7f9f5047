from pathlib import Path

def test_tail():
    assert Path('/app/report_93.txt').read_text().splitlines() == ['yarrow copper 766', 'nickel meadow 10', 'nickel indigo 547', 'raven copper 754']
