"""Constrained decoding in the torch engine (SamplingParams.grammar, llguidance): every output
matches its grammar and ends when the grammar is complete, at temperature 1 too; rows without a
grammar in the same batch are untouched; a bad grammar is an EngineError naming the cause."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from stacx.errors import EngineError
from stacx.inference.chat_template import json_grammar
from stacx.inference.guided import Guide, Guides, mask_logits
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams

pytestmark = pytest.mark.model

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


async def test_every_output_matches_its_grammar_and_stops_at_its_end(
    torch_engine: TorchEngine,
) -> None:
    tok = torch_engine.tokenizer
    prompt = list(
        tok.encode("<|im_start|>user\nWeather in Rome?<|im_end|>\n<|im_start|>assistant\n")  # type: ignore[attr-defined]
    )
    grammar = json_grammar(SCHEMA, " ", "}\n</tool_call>")
    params = SamplingParams(max_new_tokens=48, temperature=1.0, seed=3, grammar=grammar)
    free = SamplingParams(max_new_tokens=8, temperature=0.0)
    gens = await torch_engine.generate([prompt] * 4, params)
    for gen in gens:
        text = tok.decode(gen.output_ids)  # type: ignore[attr-defined]
        assert (
            gen.finish_reason == "stop"
            and text.startswith(" ")
            and text.endswith("}\n</tool_call>")
        )
        value = json.loads(text[1 : -len("}\n</tool_call>")])
        assert (
            value["city"] in ("Paris", "Rome")
            and 1 <= value["days"] <= 9
            and set(value) == {"city", "days"}
        )
    # a row without a grammar beside guided ones generates as it does alone
    [alone] = await torch_engine.generate([prompt], free)
    both = await asyncio.gather(
        torch_engine.generate([prompt], free), torch_engine.generate([prompt], params)
    )
    assert both[0][0].output_ids == alone.output_ids


async def test_a_bad_grammar_is_an_engine_error(torch_engine: TorchEngine) -> None:
    with pytest.raises(EngineError, match="the grammar is not valid"):
        await torch_engine.generate(
            [[1, 2, 3]], SamplingParams(max_new_tokens=4, grammar="start: %json {bad")
        )


def test_mask_logits_leaves_unguided_rows_and_masks_guided_ones(torch_engine: TorchEngine) -> None:
    guides = Guides(torch_engine.tokenizer, torch_engine.vocab_size)
    guide: Guide = guides.new('start: "yes" | "no"')
    logits = torch.randn(2, torch_engine.vocab_size)
    out = mask_logits(logits, [None, guide])
    assert torch.equal(out[0], logits[0])
    allowed = torch.isfinite(out[1]).nonzero().flatten().tolist()
    texts = {torch_engine.tokenizer.decode([t]) for t in allowed}  # type: ignore[attr-defined]
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts)
