import json
from pathlib import Path

EXPECTED = [{'name': 'Alice', 'age': 30, 'city': 'Lisbon'}, {'name': 'Bob', 'age': 25, 'city': 'Oslo'}, {'name': 'Chloe', 'age': 41, 'city': 'Quito'}, {'name': 'Dmitri', 'age': 19, 'city': 'Riga'}, {'name': 'Erin', 'age': 52, 'city': 'Perth'}]

def test_json():
    data = json.loads(Path("/app/people.json").read_text())
    assert data == EXPECTED
    assert all(type(row["age"]) is int for row in data)
