from pathlib import Path

def test_append():
    assert Path('/app/records_83.txt').read_text().splitlines() == ['yarrow willow 461', 'quartz copper 830', 'orchid']
