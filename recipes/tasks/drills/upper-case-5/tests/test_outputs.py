from pathlib import Path

def test_upper():
    assert Path('/app/notes_a_92.txt').read_text().splitlines() == ['COPPER ORCHID 626', 'HARBOR COPPER 470', 'QUARTZ FALCON 727']
