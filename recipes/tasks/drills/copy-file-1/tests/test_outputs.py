from pathlib import Path

def test_copy():
    assert Path('/app/sample_83.txt').read_text() == 'falcon garnet 842\nfalcon bravo 628\nvelvet indigo 488\n'
    assert Path('/app/report_47.txt').read_text() == 'falcon garnet 842\nfalcon bravo 628\nvelvet indigo 488\n'
